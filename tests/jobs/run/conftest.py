"""Fixtures for the run machinery's tests: supervisors started as the gateway starts them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Protocol

import pytest

from gateway import platform
from gateway.jobs.run import supervisor as sup
from tests.children import Children

SUPERVISOR_PATH = Path(sup.__file__).resolve()


class StartSupervisor(Protocol):
    """The `start` fixture: write a run spec for `code` into `spool` and start its supervisor
    as the gateway does (own session); reaped at the test's end."""

    def __call__(self, spool: Path, code: str, *, token: str = "t0",
                 **spec: Any) -> subprocess.Popen[bytes]: ...


@pytest.fixture
def start(children: Children) -> StartSupervisor:
    def run(spool: Path, code: str, *, token: str = "t0", **spec: Any) -> subprocess.Popen[bytes]:
        spool.mkdir(parents=True, exist_ok=True)
        values: dict[str, Any] = {
            "version": sup.RECORD_VERSION, "token": token, "job_id": "job",
            "argv": [sys.executable, "-c", textwrap.dedent(code)], "cwd": str(spool),
            "temp_cwd": False, "stdin": False, "timeout_s": 60.0, "idle_timeout_s": None,
            "max_output_bytes": 1 << 20, "kill_grace_s": 0.3, "nice": None,
            "autogroup_nice": None, **platform.supervisor_spec(),
        }
        values.update(spec)
        sup.write_record(spool, sup.RUN_NAME, values)
        return children.track(subprocess.Popen(
            [sys.executable, "-I", "-S", str(SUPERVISOR_PATH), str(spool), token],
            start_new_session=True, stdout=subprocess.DEVNULL))

    return run
