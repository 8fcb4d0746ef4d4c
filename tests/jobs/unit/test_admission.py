"""Admission on the memory store with a fake run (gateway/jobs/manager.py, drive.py): dedup
by request key, the limiter's queue and its bounds, refusals that store nothing, and a
launch that fails."""

from __future__ import annotations

import asyncio

import pytest

from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, GatewayError, JobStatus
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import FakeLauncher, MakeManager, MakeSettings, StoreClock

pytestmark = pytest.mark.anyio


async def test_an_identical_request_joins_the_running_job_and_it_runs_once(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    first = await manager.submit("claude", SubmitRequest(prompt="same task"))
    run = await launcher.run_of(first.job.id)
    again = await manager.submit("claude", SubmitRequest(prompt="same task"))
    assert not first.deduplicated and again.deduplicated
    assert again.job.id == first.job.id
    assert list(launcher.runs) == [first.job.id]
    run.finish("the answer")
    row = await manager.reads.wait(first.job.id, 5)
    assert row.status is JobStatus.COMPLETED


async def test_a_finished_job_is_reused_in_the_dedup_window_and_force_refresh_runs_anew(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    first = await manager.submit("claude", SubmitRequest(prompt="task"))
    (await launcher.run_of(first.job.id)).finish("kept")
    await manager.reads.wait(first.job.id, 5)
    reused = await manager.submit("claude", SubmitRequest(prompt="task"))
    assert reused.deduplicated and reused.job.id == first.job.id
    assert reused.job.status is JobStatus.COMPLETED
    forced = await manager.submit("claude", SubmitRequest(prompt="task", force_refresh=True))
    assert not forced.deduplicated and forced.job.id != first.job.id
    assert (await launcher.run_of(forced.job.id)).started


async def test_a_finished_job_past_the_dedup_window_is_not_reused(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    clock: StoreClock,
) -> None:
    manager = managers(unit_settings(persistence={"dedup_window_s": 60}))
    first = await manager.submit("claude", SubmitRequest(prompt="task"))
    (await launcher.run_of(first.job.id)).finish()
    await manager.reads.wait(first.job.id, 5)
    clock.move(61)
    later = await manager.submit("claude", SubmitRequest(prompt="task"))
    assert not later.deduplicated and later.job.id != first.job.id


async def test_two_identical_requests_at_the_same_moment_get_one_job_and_one_run(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    a, b = await asyncio.gather(manager.submit("claude", SubmitRequest(prompt="race")),
                                manager.submit("claude", SubmitRequest(prompt="race")))
    assert a.job.id == b.job.id
    assert sorted([a.deduplicated, b.deduplicated]) == [False, True]
    await launcher.run_of(a.job.id)
    assert list(launcher.runs) == [a.job.id]


async def test_two_instances_admitting_the_same_request_share_one_job(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    a, b = managers(settings, "gw-a"), managers(settings, "gw-b")
    first, second = await asyncio.gather(a.submit("claude", SubmitRequest(prompt="shared")),
                                         b.submit("claude", SubmitRequest(prompt="shared")))
    assert first.job.id == second.job.id
    await launcher.run_of(first.job.id)
    assert list(launcher.runs) == [first.job.id]


async def test_a_request_is_refused_and_nothing_stored_while_the_lease_is_not_held(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings(), admitting=False)
    with pytest.raises(GatewayError) as refused:
        await manager.submit("claude", SubmitRequest(prompt="task"))
    assert refused.value.kind == ErrorKind.UNAVAILABLE
    assert await store.list_jobs() == [] and launcher.runs == {}


async def test_a_closing_gateway_refuses_new_work(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    manager = managers(unit_settings())
    manager.admission.close()
    with pytest.raises(GatewayError) as refused:
        await manager.submit("claude", SubmitRequest(prompt="task"))
    assert refused.value.kind == ErrorKind.UNAVAILABLE and "shutting down" in refused.value.message
    assert await store.list_jobs() == []


async def test_an_invalid_request_is_refused_before_anything_is_stored(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    manager = managers(unit_settings())
    for provider, request in [("claud", SubmitRequest(prompt="x")),
                              ("claude", SubmitRequest(prompt="")),
                              ("claude", SubmitRequest(prompt="x", timeout_s=-1))]:
        with pytest.raises(GatewayError) as refused:
            await manager.submit(provider, request)
        assert refused.value.kind == ErrorKind.INVALID_INPUT
    assert await store.list_jobs() == []
    assert manager.limiter.snapshot()["running"] == 0


async def test_past_the_run_cap_a_job_waits_in_the_queue_and_starts_when_a_slot_frees(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: MemoryJobStore,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    first = await manager.submit("claude", SubmitRequest(prompt="first"))
    second = await manager.submit("claude", SubmitRequest(prompt="second"))
    run = await launcher.run_of(first.job.id)
    assert second.job.status is JobStatus.QUEUED
    assert manager.queue_position(second.job.id) == 1
    assert manager.queue_position(first.job.id) is None
    assert second.job.id not in launcher.runs
    run.finish()
    (await launcher.run_of(second.job.id)).finish("second answer")
    row = await manager.reads.wait(second.job.id, 5)
    assert row.status is JobStatus.COMPLETED
    stored = await store.get_job(first.job.id)
    assert stored is not None and stored.status is JobStatus.COMPLETED


async def test_a_full_queue_refuses_as_saturated_and_holds_nothing(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1, "max_queued_jobs": 1}))
    await manager.submit("claude", SubmitRequest(prompt="runs"))
    await manager.submit("claude", SubmitRequest(prompt="waits"))
    with pytest.raises(GatewayError) as refused:
        await manager.submit("claude", SubmitRequest(prompt="one too many"))
    assert refused.value.kind == ErrorKind.SATURATED and refused.value.retryable
    assert len(await store.list_jobs()) == 2
    assert manager.limiter.snapshot()["queued"] == 1


async def test_a_queued_job_that_waits_past_queue_timeout_fails_and_never_runs(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1, "queue_timeout_s": 0.05}))
    await manager.submit("claude", SubmitRequest(prompt="holds the slot"))
    waiting = await manager.submit("claude", SubmitRequest(prompt="waits"))
    row = await manager.reads.wait(waiting.job.id, 5)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.QUEUE_TIMEOUT
    assert "max_running_jobs" in (row.error or "")
    assert waiting.job.id not in launcher.runs


async def test_a_run_that_cannot_start_fails_its_job_and_frees_its_slot(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    launcher.start_error = GatewayError(ErrorKind.LAUNCH_FAILED, "no such binary")
    failed = await manager.submit("claude", SubmitRequest(prompt="fails"))
    row = await manager.reads.wait(failed.job.id, 5)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.LAUNCH_FAILED
    assert row.error == "no such binary"
    launcher.start_error = None
    after = await manager.submit("claude", SubmitRequest(prompt="runs"))
    assert after.job.status is JobStatus.RUNNING  # the slot came back: inserted running


async def test_a_run_the_provider_reports_as_an_error_ends_failed_with_provider_error(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    (await launcher.run_of(job.id)).finish("rate limited", is_error=True)
    row = await manager.reads.wait(job.id, 5)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.PROVIDER_ERROR
    assert row.error == "rate limited"
