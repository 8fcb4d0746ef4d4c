"""The supervisor program on its own: started as the gateway starts it, watched with no gateway.

Real processes only; the test process plays the gateway that started the supervisor and then
"died" (it never waits on it: the supervisor must enforce its rules and record its end alone).
Only once the test has looked is the supervisor reaped (the `children` fixture): a dead
gateway's supervisor is collected by init, and here the test process is its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway import platform, proc
from gateway.jobs.run import supervisor as sup
from tests.children import Children
from tests.jobs.run.conftest import SUPERVISOR_PATH, StartSupervisor
from tests.waiting import scaled

DEADLINE_S = 20.0
pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]


async def end_record(spool: Path) -> dict[str, Any]:
    with anyio.fail_after(scaled(DEADLINE_S)):
        while (record := sup.read_record(spool, sup.END_NAME)) is None:
            await anyio.sleep(0.02)
    return record


async def test_a_clean_run_records_its_exit_code_and_times(tmp_path: Path, start: StartSupervisor) -> None:
    supervisor = start(tmp_path, "import sys; print('answer'); sys.exit(3)")
    record = await end_record(tmp_path)
    assert supervisor.wait(DEADLINE_S) == 0
    assert record["version"] == sup.RECORD_VERSION
    assert (record["why"], record["returncode"]) == (sup.WHY_EXIT, 3)
    assert record["pid"] == supervisor.pid == record["pgid"]
    assert record["started_at"] <= record["ended_at"]
    assert (tmp_path / "stdout").read_text() == "answer\n"
    claim = json.loads((tmp_path / sup.START_NAME).read_text())
    assert claim["kind"] == "supervisor" and claim["pid"] == supervisor.pid
    # Its start time is what the gateway's liveness check reads (psutil's create_time).
    assert abs(claim["started_at"] - (proc.process_start_time(supervisor.pid) or 0)) < 1.0 \
        or supervisor.returncode is not None


async def test_the_wall_clock_timeout_holds_with_no_gateway_and_kills_a_stubborn_group(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    code = """
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open("grandchild.pid", "w").write(str(os.getpid()))
            time.sleep(60)
        time.sleep(60)
    """
    # The grandchild must be forked (and its pid written) before the timeout: scaled for load.
    supervisor = start(tmp_path, code, timeout_s=scaled(0.5))
    record = await end_record(tmp_path)
    assert record["why"] == sup.WHY_TIMEOUT
    assert record["returncode"] == -signal.SIGKILL  # SIGTERM was ignored
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert not proc.is_process_alive(grandchild, proc.process_start_time(grandchild) or 0.0)
    assert supervisor.wait(DEADLINE_S) == 0
    assert not proc.group_alive(supervisor.pid)


async def test_the_output_cap_stops_the_run_and_cuts_the_files(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    start(tmp_path, "import sys, time\nsys.stdout.write('x' * 5000); sys.stdout.flush()\n"
                    "time.sleep(60)", max_output_bytes=1000)
    record = await end_record(tmp_path)
    assert record["why"] == sup.WHY_OUTPUT and record["truncated"]
    assert record["bytes_written"] >= 5000
    assert (tmp_path / "stdout").stat().st_size == 1000


async def test_a_stop_request_names_the_reason_and_keeps_the_grace(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    supervisor = start(tmp_path, "import time; print('ready', flush=True); time.sleep(60)")
    with anyio.fail_after(scaled(DEADLINE_S)):
        while not (tmp_path / "stdout").exists() or not (tmp_path / "stdout").stat().st_size:
            await anyio.sleep(0.02)
    sup.write_record(tmp_path, sup.STOP_NAME, {"version": sup.RECORD_VERSION,
                                               "kind": "cancelled", "message": "bye",
                                               "grace_s": 0.2})
    os.kill(supervisor.pid, signal.SIGTERM)
    record = await end_record(tmp_path)
    assert (record["why"], record["stop_kind"], record["stop_message"]) == (
        sup.WHY_STOP, "cancelled", "bye")
    assert record["returncode"] == -signal.SIGTERM


async def test_the_prompt_reaches_stdin_whole_and_the_file_is_removed(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    tmp_path.mkdir(exist_ok=True)
    payload = "é" * 200_000
    (tmp_path / sup.STDIN_NAME).write_text(payload)
    start(tmp_path, "import sys; sys.stdout.write(sys.stdin.read())", stdin=True)
    record = await end_record(tmp_path)
    assert record["returncode"] == 0 and not record["stdin_incomplete"]
    assert (tmp_path / "stdout").read_text() == payload
    assert not (tmp_path / sup.STDIN_NAME).exists()


async def test_a_missing_command_is_recorded_as_not_found(tmp_path: Path, start: StartSupervisor) -> None:
    start(tmp_path, "", argv=[str(tmp_path / "no-such-cli")])
    record = await end_record(tmp_path)
    assert record["why"] == sup.WHY_NOT_FOUND and "no-such-cli" in record["error"]


async def test_a_run_claimed_for_requeue_is_never_started_by_a_late_supervisor(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    marker = tmp_path / "ran"
    tmp_path.mkdir(exist_ok=True)
    assert sup.claim_for_requeue(tmp_path, by="instance-b")
    supervisor = start(tmp_path, f"open({str(marker)!r}, 'w')")
    assert supervisor.wait(DEADLINE_S) == sup.CLAIMED_ELSEWHERE_EXIT
    assert not marker.exists() and sup.read_record(tmp_path, sup.END_NAME) is None
    assert (sup.read_record(tmp_path, sup.START_NAME) or {}).get("kind") == "requeued"


async def test_a_started_run_cannot_be_claimed_for_requeue(tmp_path: Path, start: StartSupervisor) -> None:
    start(tmp_path, "print('done')")
    await end_record(tmp_path)
    assert (sup.read_record(tmp_path, sup.START_NAME) or {}).get("kind") == "supervisor"
    assert not sup.claim_for_requeue(tmp_path, by="instance-b")


async def test_a_supervisor_with_another_launch_token_never_runs_the_spec(
    tmp_path: Path, start: StartSupervisor, children: Children,
) -> None:
    marker = tmp_path / "ran"
    start(tmp_path, f"open({str(marker)!r}, 'w')", token="new")
    await end_record(tmp_path)
    marker.unlink()
    late = children.track(subprocess.Popen(
        [sys.executable, "-I", "-S", str(SUPERVISOR_PATH), str(tmp_path), "old"]))
    assert late.wait(DEADLINE_S) == sup.CLAIMED_ELSEWHERE_EXIT
    assert not marker.exists()


def test_racing_claims_have_exactly_one_winner(tmp_path: Path) -> None:
    results = [sup.claim_record(tmp_path, "claim.json", {"n": n}) for n in range(20)]
    assert results.count(True) == 1
    assert sup.read_record(tmp_path, "claim.json") == {"n": 0}


@pytest.mark.parametrize("name", [sup.RUN_NAME, sup.END_NAME])
def test_records_are_private(tmp_path: Path, name: str) -> None:
    sup.write_record(tmp_path, name, {"version": 1})
    assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_supervisor_imports_nothing_but_the_stdlib() -> None:
    code = ("import runpy, sys; runpy.run_path(sys.argv[1]);"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('gateway', 'providers', "
            "'psutil', 'structlog', 'pydantic')]; print(bad)")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(SUPERVISOR_PATH)],
                         capture_output=True, text=True, check=True, timeout=DEADLINE_S)
    assert out.stdout.strip() == "[]"


async def test_the_cli_gets_its_stdio_and_working_dir_and_no_other_descriptor(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    """The CLI is started with posix_spawn (no Popen, which closed every other descriptor):
    nothing the supervisor holds open leaks into it, and it runs where the spec says."""
    work = tmp_path / "work"
    work.mkdir()
    start(tmp_path / "spool", """
        import json, os
        print(json.dumps({"fds": sorted(int(fd) for fd in os.listdir("/dev/fd")),
                          "cwd": os.getcwd()}))
    """, cwd=str(work))
    record = await end_record(tmp_path / "spool")
    assert record["returncode"] == 0
    seen = json.loads((tmp_path / "spool" / "stdout").read_text())
    # 0-2, and the one listdir() itself opened: the lowest free descriptor
    assert (seen["fds"], seen["cwd"]) == ([0, 1, 2, 3], str(work.resolve()))


async def test_a_missing_working_dir_is_recorded_and_nothing_runs(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    marker = tmp_path / "ran"
    start(tmp_path, f"open({str(marker)!r}, 'w')", cwd=str(tmp_path / "gone"))
    record = await end_record(tmp_path)
    assert record["why"] == sup.WHY_NOT_FOUND and not marker.exists()


async def test_a_supervisor_started_with_its_stdio_closed_still_wires_the_cli_right(
    tmp_path: Path, children: Children,
) -> None:
    """The spool files then open as descriptors 0 and 1: the CLI's stdout must still be its
    stdout file, not its stdin (the dup2 actions run in order)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    sup.write_record(spool, sup.RUN_NAME, {
        "version": sup.RECORD_VERSION, "token": "t0", "job_id": "job",
        "argv": [sys.executable, "-c", "import sys; print(sys.stdin.read() == '')"],
        "cwd": str(spool), "temp_cwd": False, "stdin": False, "timeout_s": 60.0,
        "idle_timeout_s": None, "max_output_bytes": 1 << 20, "kill_grace_s": 0.3,
        "nice": None, "autogroup_nice": None, **platform.supervisor_spec()})
    closing = ("import os, sys; os.close(0); os.close(1); "
               "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
    children.track(subprocess.Popen(
        [sys.executable, "-c", closing, "-I", "-S", str(SUPERVISOR_PATH), str(spool), "t0"],
        start_new_session=True))
    record = await end_record(spool)
    assert record["returncode"] == 0
    assert (spool / "stdout").read_text() == "True\n"
