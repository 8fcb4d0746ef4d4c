"""Cancel, wait, result pages and drain on the memory store with a fake run
(gateway/jobs/manager.py, drive.py, reads.py, and the cancel poller of leases.py)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.jobs.leases import LeaseKeeper
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run.spool import spool_root
from gateway.model import ErrorKind, GatewayError, JobStatus
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import WAIT_S, FakeLauncher, MakeManager, MakeSettings, identity
from tests.waiting import scaled

pytestmark = pytest.mark.anyio


async def test_cancelling_a_running_job_stops_its_run_and_answers_the_cancelled_row(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="long"))).job
    run = await launcher.run_of(job.id)
    outcome = await manager.cancel(job.id)
    assert run.cancelled == ErrorKind.CANCELLED
    assert outcome.outcome == "cancelled"
    assert outcome.job.status is JobStatus.CANCELLED
    assert outcome.job.error_kind == ErrorKind.CANCELLED
    assert manager.local_job_ids() == [] and manager.limiter.snapshot()["running"] == 0


async def test_cancelling_a_queued_job_ends_it_before_it_ever_runs(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    first = (await manager.submit("claude", SubmitRequest(prompt="runs"))).job
    queued = (await manager.submit("claude", SubmitRequest(prompt="waits"))).job
    outcome = await manager.cancel(queued.id)
    assert outcome.outcome == "cancelled"
    assert outcome.job.status is JobStatus.CANCELLED
    assert outcome.job.error == "Cancelled before it started."
    (await launcher.run_of(first.id)).finish()
    await manager.reads.wait(first.id, WAIT_S)
    assert queued.id not in launcher.runs  # the slot that freed did not go to it


async def test_cancelling_an_ended_job_changes_nothing(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="quick"))).job
    (await launcher.run_of(job.id)).finish("ok")
    await manager.reads.wait(job.id, WAIT_S)
    outcome = await manager.cancel(job.id)
    assert outcome.outcome == "already_terminal"
    assert outcome.job.status is JobStatus.COMPLETED and outcome.job.cancel_requested_at is None


async def test_cancelling_an_unknown_job_is_job_not_found(
    unit_settings: MakeSettings, managers: MakeManager,
) -> None:
    manager = managers(unit_settings())
    with pytest.raises(GatewayError) as missing:
        await manager.cancel("no-such-job")
    assert missing.value.kind == ErrorKind.JOB_NOT_FOUND


async def test_a_cancel_through_another_instance_is_requested_on_the_row_and_the_owner_stops_it(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: MemoryJobStore,
) -> None:
    settings = unit_settings()
    owner, other = managers(settings, "gw-a"), managers(settings, "gw-b")
    job = (await owner.submit("claude", SubmitRequest(prompt="long"))).job
    run = await launcher.run_of(job.id)
    outcome = await other.cancel(job.id)
    assert outcome.outcome == "cancel_requested" and outcome.job.cancel_requested_at is not None
    assert run.cancelled is None  # only its owner stops it: through its cancel poller
    keeper = LeaseKeeper(settings, store, owner, identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.poll_cancels_once()
    assert run.cancelled == ErrorKind.CANCELLED
    row = await other.reads.wait(job.id, WAIT_S)
    assert row.status is JobStatus.CANCELLED


async def test_a_wait_returns_the_terminal_row_as_soon_as_the_run_ends(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    run = await launcher.run_of(job.id)
    waiter = asyncio.create_task(manager.reads.wait(job.id, 60))
    await asyncio.sleep(0)
    assert not waiter.done()
    run.finish("the answer")
    with anyio.fail_after(scaled(WAIT_S)):
        row = await waiter
    assert row.status is JobStatus.COMPLETED and row.exit_code == 0


async def test_a_wait_that_times_out_returns_the_job_still_running(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    await launcher.run_of(job.id)
    row = await manager.reads.wait(job.id, 0.05)
    assert row.status is JobStatus.RUNNING


async def test_a_wait_from_another_instance_sees_the_end_through_the_store(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    owner, reader = managers(settings, "gw-a"), managers(settings, "gw-b")
    job = (await owner.submit("claude", SubmitRequest(prompt="task"))).job
    run = await launcher.run_of(job.id)
    waiter = asyncio.create_task(reader.reads.wait(job.id, 30))
    run.finish("seen elsewhere")
    with anyio.fail_after(scaled(WAIT_S)):
        row = await waiter
    assert row.status is JobStatus.COMPLETED
    page = await reader.reads.read_result(job.id)
    assert page.output == "seen elsewhere" and page.complete


async def test_result_pages_never_split_a_character_and_join_to_the_answer(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    answer = "naïve café — 日本語 🎉 done"
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    (await launcher.run_of(job.id)).finish(answer)
    await manager.reads.wait(job.id, WAIT_S)
    pieces, offset = [], 0
    while True:
        page = await manager.reads.read_result(job.id, offset=offset, max_bytes=5)
        pieces.append(page.output)
        assert len(page.output.encode()) <= 5 or len(page.output) == 1
        if page.next_offset is None:
            assert page.complete
            break
        offset = page.next_offset
    assert "".join(pieces) == answer
    with pytest.raises(GatewayError) as bad:
        await manager.reads.read_result(job.id, offset=-1)
    assert bad.value.kind == ErrorKind.INVALID_INPUT


async def test_a_job_list_filters_by_status_and_refuses_an_unknown_one(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    done = (await manager.submit("claude", SubmitRequest(prompt="one"))).job
    (await launcher.run_of(done.id)).finish()
    await manager.reads.wait(done.id, WAIT_S)
    running = (await manager.submit("claude", SubmitRequest(prompt="two"))).job
    await launcher.run_of(running.id)
    assert [j.id for j in await manager.reads.list_jobs(status="completed")] == [done.id]
    assert [j.id for j in await manager.reads.list_jobs(status="running")] == [running.id]
    with pytest.raises(GatewayError) as bad:
        await manager.reads.list_jobs(status="finished")
    assert bad.value.kind == ErrorKind.INVALID_INPUT


async def test_drain_fails_queued_jobs_as_shutdown_and_stops_the_running_ones(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: MemoryJobStore,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    running = (await manager.submit("claude", SubmitRequest(prompt="runs"))).job
    queued = (await manager.submit("claude", SubmitRequest(prompt="waits"))).job
    run = await launcher.run_of(running.id)
    assert await manager.drain(WAIT_S)
    assert run.cancelled == ErrorKind.SHUTDOWN
    stopped, failed = await store.get_job(running.id), await store.get_job(queued.id)
    assert stopped is not None and stopped.status is JobStatus.FAILED
    assert stopped.error_kind == ErrorKind.SHUTDOWN
    assert failed is not None and failed.status is JobStatus.FAILED
    assert failed.error_kind == ErrorKind.SHUTDOWN and queued.id not in launcher.runs
