"""Runs one provider invocation as its own process group (DESIGN.md section 5).

INTERFACE CONTRACT (implementation pending): the job manager relies on exactly this API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gateway.jobs.model import ErrorKind
from providers.base import Invocation


@dataclass(slots=True)
class RunSpec:
    job_id: str
    invocation: Invocation
    spool_dir: Path  # per-job directory; stdout/stderr are spooled to files in it
    working_dir: str | None  # must exist; None: a fresh private temp dir (removed after)
    timeout_s: float  # wall clock
    idle_timeout_s: float | None  # None: never idle-killed (providers that print at exit)
    max_output_bytes: int
    kill_grace_s: float
    install_hint: str = ""  # shown when the binary is missing


@dataclass(slots=True)
class ProcessIdentity:
    pid: int
    pgid: int
    started_at: float  # process start time (epoch seconds, psutil create_time)


@dataclass(slots=True)
class RunOutcome:
    exit_code: int | None  # the provider's own exit code, or the gateway's code (124...)
    error_kind: ErrorKind | None  # None on a clean exit 0
    error: str | None
    stdout_path: Path
    stderr_path: Path
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    duration_s: float
    signal: int | None = None  # set when the leader died of a signal
    extra: dict[str, object] = field(default_factory=dict)
