"""A run's supervisor killed or stopped from outside (issue 23, items 1, 6 and 14): the job
still ends, with what really happened, and nothing runs twice or is left running.

Real gateways on a real store (SQLite file and PostgreSQL), real supervisors and fake CLIs.
The faults are real signals sent at the moment the finding needs, from inside the launch
path: a wrapper of the zygote's `fork` makes the run's log a FIFO first, so the forked
supervisor blocks opening it, before it can claim its run, and the test decides when it dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run import runner
from gateway.jobs.run import supervisor as sup
from gateway.model import ErrorKind, JobStatus
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.waiting import scaled, wait_for

pytestmark = pytest.mark.anyio

DONE_S = 20.0


def spool_of(settings: Any, job_id: str) -> Path:
    return Path(settings.state_dir) / "spool" / job_id / "0"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def handed_over(monkeypatch: pytest.MonkeyPatch) -> list[psutil.Process]:
    """Every supervisor forked for a run blocks before it claims it: its first act, opening
    the run's log, waits on a FIFO nobody reads. The processes, in order (psutil's, so a
    signal sent after one ended never reaches another process that got its pid: on a busy
    box with pid_max 32768 a pid comes round again within a suite)."""
    pids: list[psutil.Process] = []
    real = runner.ZYGOTE.fork

    async def fork_blocked_before_the_claim(spool_dir: Path, *args: Any) -> tuple[int, Any]:
        os.mkfifo(spool_dir / sup.LOG_NAME, 0o600)
        pid, link = await real(spool_dir, *args)
        pids.append(psutil.Process(pid))
        return pid, link

    monkeypatch.setattr(runner.ZYGOTE, "fork", fork_blocked_before_the_claim)
    return pids


async def terminal(manager: Any, job_id: str) -> Any:
    row = await manager.reads.get(job_id)
    return row if row.status.is_terminal else None


@pytest.mark.parametrize("then", ["nothing", "cancel", "identical request"])
async def test_a_supervisor_killed_between_its_hand_over_and_its_claim_ends_the_job(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    handed_over: list[psutil.Process], then: str,
) -> None:
    # Issue 23, item 1: the job stayed running for good while its gateway lived (its lease
    # renewed, a cancel never applied, an identical request joining it and waiting), because
    # the launcher read "no end record, the claim is not ours" as another gateway's re-queue.
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    request = SubmitRequest(prompt="killed at start")
    sub = await manager.submit("claude", request)
    await wait_for(lambda: handed_over, DONE_S)
    if then == "cancel":
        await manager.cancel(sub.job.id)
    elif then == "identical request":
        joined = await manager.submit("claude", request)
        assert joined.deduplicated and joined.job.id == sub.job.id
    # An OOM kill of the supervisor at its start (after a cancel, the cancel's SIGTERM may
    # have ended it already: it had not set its handler yet, and that too leaves no claim).
    with contextlib.suppress(psutil.NoSuchProcess):
        handed_over[0].kill()
    row = await wait_for(lambda: terminal(manager, sub.job.id), DONE_S)
    if then == "cancel":
        assert (row.status, row.error_kind) == (JobStatus.CANCELLED, ErrorKind.CANCELLED)
    else:
        assert (row.status, row.error_kind) == (JobStatus.FAILED, ErrorKind.LAUNCH_FAILED)
        assert row.exit_code == 126
        assert "SIGKILL" in (row.error or "") and "nothing ran" in (row.error or "")
    await wait_for(lambda: sub.job.id not in manager.local_job_ids(), DONE_S)
    assert fake_log.spawns() == []  # nothing ran, and nothing will: the run is claimed


async def test_a_supervisor_killed_from_outside_while_its_run_ran_reads_failed_with_the_signal(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Issue 23, item 14: it read launch_failed although the CLI had run.
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", SubmitRequest(prompt="runs a while @sleep=30"))
    await wait_for(lambda: fake_log.spawns(), DONE_S)
    cli_pid = fake_log.spawns()[0]["pid"]
    claim = sup.read_record(spool_of(settings, sub.job.id), sup.START_NAME)
    assert claim is not None and claim["kind"] == "supervisor"
    os.kill(int(claim["pid"]), signal.SIGKILL)
    row = await wait_for(lambda: terminal(manager, sub.job.id), DONE_S)
    assert (row.status, row.error_kind) == (JobStatus.FAILED, ErrorKind.PROVIDER_ERROR)
    assert row.exit_code == 128 + signal.SIGKILL
    assert "supervisor was killed by SIGKILL" in (row.error or "")
    assert not alive(cli_pid)  # its group went with it
    assert len(fake_log.spawns()) == 1


async def test_a_stopped_supervisor_s_run_is_stopped_by_the_gateway_past_its_wall_clock(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Issue 23, item 6: a SIGSTOPped supervisor of a timeout_s=3 job enforced nothing; at
    # 15 s the job was still running and its CLI alive.
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    # The CLI must have started (and logged it) before its timeout ends it: at load 20 the
    # fake took over 3 s to start, its supervisor timed it out first, and no spawn came.
    timeout_s = round(scaled(3.0), 1)
    sub = await manager.submit("claude", SubmitRequest(prompt="too slow @sleep=600",
                                                       timeout_s=timeout_s))
    await wait_for(lambda: fake_log.spawns(), DONE_S)
    cli_pid = fake_log.spawns()[0]["pid"]
    claim = sup.read_record(spool_of(settings, sub.job.id), sup.START_NAME)
    assert claim is not None
    os.kill(int(claim["pid"]), signal.SIGSTOP)
    bound = timeout_s + settings.limits.kill_grace_s + runner.WALL_BACKSTOP_MARGIN_S + DONE_S
    row = await wait_for(lambda: terminal(manager, sub.job.id), bound)
    assert (row.status, row.error_kind, row.exit_code) == (JobStatus.TIMED_OUT,
                                                           ErrorKind.TIMEOUT, 124)
    assert not alive(cli_pid) and not alive(int(claim["pid"]))
