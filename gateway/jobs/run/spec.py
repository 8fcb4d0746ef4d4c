"""What a run is, outside the `ProcessRun` that drives it: its spec, its supervisor's identity,
and what can be read from or asked of a run through its spool alone (a run another gateway
started: adoption reads its spec back, a cancel of a job orphaned elsewhere stops it).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from gateway import proc
from gateway.config import PROVIDER_NICE_DEFAULT
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.record_to_outcome import Limits, stop_message
from gateway.model import ErrorKind
from providers.base import Invocation


class RunClaimedElsewhere(Exception):
    """The run is not this gateway's to launch any more: a gateway that judged this one gone
    claimed its spool to re-queue the job (the supervisor started here lost the claim), or
    removed the spool dir before the launch began. The job is that gateway's to settle.
    Nothing about it may be written from here."""


@dataclass(slots=True)
class RunSpec:
    job_id: str
    invocation: Invocation
    spool_dir: Path  # the launch's dir (spool.run_dir), made before; stdout/stderr go there
    working_dir: str | None  # must exist; None: a fresh private temp dir (removed after)
    timeout_s: float  # wall clock
    idle_timeout_s: float | None  # None: never idle-killed (providers that print at exit)
    max_output_bytes: int
    kill_grace_s: float
    # Nice levels below the gateway for the run's group and its autogroup ([limits]
    # provider_nice); only a launch uses it (an attached run was niced when it started).
    provider_nice: int = PROVIDER_NICE_DEFAULT
    # Variables of the gateway's environment the child must not see, besides AGENT_GATEWAY_*
    # (gateway.childenv.secret_env_names of the settings).
    secret_env: frozenset[str] = frozenset()
    install_hint: str = ""  # shown when the binary is missing

    @property
    def limits(self) -> Limits:
        return Limits(self.timeout_s, self.idle_timeout_s, self.max_output_bytes)


@dataclass(slots=True)
class ProcessIdentity:
    """The supervisor: it leads the run's group (pgid == pid)."""

    pid: int
    pgid: int
    started_at: float  # process start time (epoch seconds, psutil create_time)


def directories_error(exc: OSError) -> str:
    """The failure to prepare a run's spool or temp dir (EACCES, ENOSPC, EROFS), readable."""
    return (f"Cannot prepare the run's directories ({exc.strerror or exc}: {exc.filename}); "
            f"the gateway's state directory must be writable by its user.")


def spec_from_spool(job_id: str, spool_dir: Path) -> RunSpec | None:
    """The spec of a run another gateway started, from its run.json (None if absent)."""
    record = sup.read_record(spool_dir, sup.RUN_NAME)
    if record is None:
        return None
    return RunSpec(job_id=job_id, invocation=Invocation(argv=list(record.get("argv") or [])),
                   spool_dir=spool_dir, working_dir=record.get("cwd"),
                   timeout_s=float(record["timeout_s"]),
                   idle_timeout_s=record.get("idle_timeout_s"),
                   max_output_bytes=int(record["max_output_bytes"]),
                   kill_grace_s=float(record["kill_grace_s"]))


def stop_supervised_run(spool_dir: Path, reason: ErrorKind, grace_s: float) -> bool:
    """Ask the supervisor of a run this gateway does not drive to stop it (a cancel of a job
    orphaned elsewhere while its process still runs on this host). True if one was alive."""
    claim = sup.read_record(spool_dir, sup.START_NAME)
    if claim is None or claim.get("kind") != "supervisor":
        return False
    pid, started_at = int(claim["pid"]), float(claim["started_at"])
    if not proc.is_process_alive(pid, started_at):
        return False
    sup.write_record(spool_dir, sup.STOP_NAME, {
        "version": sup.RECORD_VERSION, "kind": str(reason), "grace_s": grace_s,
        "message": stop_message(reason, Limits(0, None, 0))})
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    return True
