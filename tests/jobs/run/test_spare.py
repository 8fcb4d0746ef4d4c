"""The supervisor started ahead of need (gateway/jobs/run/spare.py): it runs the run it is handed,
with the run's environment, and holds nothing of anyone's while it waits.

Real processes: the spares are real supervisors, the runs real (small) Python programs.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import anyio
import psutil
import pytest

from gateway import platform
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.spare import Spares, hand_over

DEADLINE_S = 20.0
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]


def write_run(spool: Path, code: str, token: str) -> None:
    spool.mkdir(parents=True, exist_ok=True)
    sup.write_record(spool, sup.RUN_NAME, {
        "version": sup.RECORD_VERSION, "token": token, "job_id": "job",
        "argv": [sys.executable, "-c", textwrap.dedent(code)], "cwd": str(spool),
        "temp_cwd": False, "stdin": False, "timeout_s": 60.0, "idle_timeout_s": None,
        "max_output_bytes": 1 << 20, "kill_grace_s": 0.3, "nice": None, "autogroup_nice": None,
        **platform.supervisor_spec(),
    })


async def end_record(spool: Path) -> dict[str, object]:
    with anyio.fail_after(DEADLINE_S):
        while (record := sup.read_record(spool, sup.END_NAME)) is None:
            await anyio.sleep(0.02)
    return record


async def test_a_spare_runs_the_run_it_is_handed_with_the_runs_environment(
    tmp_path: Path,
) -> None:
    spares = Spares(nice_increment=0)
    spare = spares.take()
    write_run(tmp_path, "import os; print(os.environ.get('RUN_ONLY'), os.getcwd())", "t1")
    hand_over(spare, tmp_path, "t1", {"RUN_ONLY": "from the run", "PATH": os.defpath})
    record = await end_record(tmp_path)
    assert spare.wait(DEADLINE_S) == 0
    assert (record["why"], record["returncode"], record["pid"]) == (sup.WHY_EXIT, 0, spare.pid)
    assert (tmp_path / sup.STDOUT_NAME).read_text() == f"from the run {tmp_path}\n"
    claim = sup.read_record(tmp_path, sup.START_NAME)
    assert claim is not None and claim["pid"] == claim["pgid"] == spare.pid


async def test_a_waiting_spare_holds_no_directory_and_no_environment(tmp_path: Path) -> None:
    spares = Spares(nice_increment=0)
    spares.refill()
    spare = spares.take()
    try:
        process = psutil.Process(spare.pid)
        assert process.cwd() == "/"
        assert process.environ() == {}
        assert os.getpgid(spare.pid) == spare.pid  # it leads its own group, as a run needs
    finally:
        hand_over(spare, tmp_path, "never", {})  # a token no run.json has: nothing runs
        assert spare.wait(DEADLINE_S) == sup.CLAIMED_ELSEWHERE_EXIT
    assert not (tmp_path / sup.START_NAME).exists()


async def test_a_spare_whose_gateway_goes_exits_without_doing_anything(tmp_path: Path) -> None:
    spares = Spares(nice_increment=0)
    spares.refill()
    spare = spares.take()
    spares.refill()
    spares.close()  # the refilled one: EOF
    assert spare.stdin is not None
    spare.stdin.close()  # as when its gateway is SIGKILLed: EOF on its stdin
    assert spare.wait(DEADLINE_S) == 0
    assert list(tmp_path.iterdir()) == []


async def test_a_spare_that_died_while_waiting_is_replaced(tmp_path: Path) -> None:
    spares = Spares(nice_increment=0)
    spares.refill()
    dead = spares.take()
    dead.kill()
    dead.wait(DEADLINE_S)
    spares._spare = dead  # as if it had died in place, unnoticed
    fresh = spares.take()
    assert fresh.pid != dead.pid and fresh.poll() is None
    write_run(tmp_path, "print('ran')", "t2")
    hand_over(fresh, tmp_path, "t2", {"PATH": os.defpath})
    assert (await end_record(tmp_path))["returncode"] == 0
    assert fresh.wait(DEADLINE_S) == 0
