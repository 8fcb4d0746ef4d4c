"""The JobRows role on every backend: admission and dedup, the compare-and-set transitions,
cancel and progress (the reaper, reads, races and adoption have files of their own).
"""

from __future__ import annotations

import dataclasses

import pytest

from gateway.model import (
    Completion,
    JobStatus,
    Progress,
)
from gateway.store.base import DuplicateActiveJob, JobStore
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    HTTP_GRACE_S,
    OTHER,
    OWNER,
    PAST_S,
    TTL_S,
    WINDOW_S,
    done,
    epoch,
    get,
    new_job,
    orphaned,
    reap,
    running,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio


# -- admission: insert and dedup ----------------------------------------------------------

async def test_insert_job_stores_a_queued_row_with_a_lease_from_the_store_clock(
    store: JobStore,
) -> None:
    job = new_job(transport="http")
    before = await store.now()
    row = await store.insert_job(job, TTL_S)
    after = await store.now()
    assert row == await get(store, job.id)
    assert row.status is JobStatus.QUEUED
    for name in (
        "id", "provider", "request_key", "owner_instance", "transport", "correlation_id",
        "hostname", "boot_id", "working_dir", "model", "session_id", "request_json", "forced",
    ):
        assert getattr(row, name) == getattr(job, name), name
    assert before - 1e-3 <= epoch(row.created_at) <= after + 1e-3
    assert epoch(row.updated_at) == pytest.approx(epoch(row.created_at), abs=1e-3)
    assert epoch(row.lease_deadline) == pytest.approx(epoch(row.created_at) + TTL_S, abs=1e-3)
    assert row.started_at is None and row.finished_at is None
    assert row.pid is None and row.pgid is None and row.pid_started_at is None
    assert (row.output_bytes, row.truncated, row.cancel_requested_at) == (0, False, None)


async def test_second_active_job_with_the_same_key_is_refused_naming_the_first(
    store: JobStore,
) -> None:
    first = await store.insert_job(new_job(key="same"), TTL_S)
    with pytest.raises(DuplicateActiveJob) as caught:
        await store.insert_job(new_job(key="same", owner=OTHER), TTL_S)
    assert caught.value.existing_id == first.id
    # Still refused once running: the key is taken while the job is active.
    assert await store.mark_running(first.id, OWNER, TTL_S)
    with pytest.raises(DuplicateActiveJob):
        await store.insert_job(new_job(key="same"), TTL_S)
    assert [r.id for r in await store.list_jobs()] == [first.id]


async def test_a_finished_job_frees_its_key_for_a_new_active_job(store: JobStore) -> None:
    first = await running(store, new_job(key="same"))
    assert await store.complete(first.id, OWNER, done(JobStatus.FAILED))
    second = await store.insert_job(new_job(key="same"), TTL_S)
    assert second.status is JobStatus.QUEUED


async def test_forced_job_is_neither_blocked_by_nor_found_by_dedup(store: JobStore) -> None:
    active = await store.insert_job(new_job(key="k"), TTL_S)
    forced = await store.insert_job(new_job(key="k", forced=True), TTL_S)
    assert forced.forced is True
    reused = await store.find_reusable("k", 3600)
    assert reused is not None and reused.id == active.id

    # A forced job alone is invisible to dedup and does not hold the key.
    assert await store.complete(active.id, OWNER, done(JobStatus.FAILED))
    assert await store.find_reusable("k", 3600) is None
    third = await store.insert_job(new_job(key="k"), TTL_S)
    assert third.status is JobStatus.QUEUED
    assert await store.insert_job(new_job(key="k", forced=True), TTL_S)  # forced again: fine


async def test_find_reusable_returns_active_jobs_whatever_their_age(store: JobStore) -> None:
    job = new_job(key="k")
    row = await store.insert_job(job, TTL_S)
    await wait_for_store_time(store, epoch(row.created_at) + PAST_S)
    found = await store.find_reusable("k", WINDOW_S)
    assert found is not None and (found.id, found.status) == (job.id, JobStatus.QUEUED)
    assert await store.mark_running(job.id, OWNER, TTL_S)
    found = await store.find_reusable("k", 0)
    assert found is not None and (found.id, found.status) == (job.id, JobStatus.RUNNING)


async def test_find_reusable_returns_a_completed_job_only_within_the_window(
    store: JobStore,
) -> None:
    job = await running(store, new_job(key="k"))
    assert await store.complete(job.id, OWNER, done(output="answer"))
    finished = await get(store, job.id)
    found = await store.find_reusable("k", 3600)
    assert found is not None and found.id == job.id and found.status is JobStatus.COMPLETED

    await wait_for_store_time(store, epoch(finished.finished_at) + PAST_S)
    assert await store.find_reusable("k", WINDOW_S) is None  # finished before the window
    assert await store.find_reusable("k", 3600) is not None


@pytest.mark.parametrize(
    "status", [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT]
)
async def test_find_reusable_never_reuses_an_unsuccessful_run(
    store: JobStore, status: JobStatus
) -> None:
    job = await running(store, new_job(key="k"))
    assert await store.complete(job.id, OWNER, done(status))
    assert await store.find_reusable("k", 3600) is None


async def test_find_reusable_never_reuses_an_orphaned_job(store: JobStore) -> None:
    await orphaned(store, new_job(key="k"))
    assert await store.find_reusable("k", 3600) is None


async def test_find_reusable_prefers_the_newest_candidate(store: JobStore) -> None:
    older = await running(store, new_job(key="k"))
    assert await store.complete(older.id, OWNER, done())
    newer = await running(store, new_job(key="k"))
    assert await store.complete(newer.id, OWNER, done())
    found = await store.find_reusable("k", 3600)
    assert found is not None and found.id == newer.id
    active = await store.insert_job(new_job(key="k"), TTL_S)
    found = await store.find_reusable("k", 3600)
    assert found is not None and found.id == active.id
    assert await store.find_reusable("other-key", 3600) is None


# -- transitions --------------------------------------------------------------------------

async def test_mark_running_stamps_the_start_and_renews_the_lease(store: JobStore) -> None:
    job = new_job()
    queued = await store.insert_job(job, 1.0)
    before = await store.now()
    assert await store.mark_running(job.id, OWNER, TTL_S)
    row = await get(store, job.id)
    assert row.status is JobStatus.RUNNING
    assert (row.pid, row.pgid, row.pid_started_at) == (None, None, None)  # not spawned yet
    assert epoch(row.started_at) >= before - 1e-3
    assert epoch(row.lease_deadline) >= before + TTL_S - 1e-3
    assert epoch(row.lease_deadline) > epoch(queued.lease_deadline)


async def test_insert_job_running_stamps_the_start_and_needs_no_cas(store: JobStore) -> None:
    """A job admitted into a free run slot is inserted running: one write, not two."""
    job = dataclasses.replace(new_job(key="k"), running=True)
    before = await store.now()
    row = await store.insert_job(job, TTL_S)
    assert row.status is JobStatus.RUNNING and row == await get(store, job.id)
    assert epoch(row.started_at) >= before - 1e-3
    assert (row.pid, row.finished_at) == (None, None)  # not spawned yet
    assert not await store.mark_running(job.id, OWNER, TTL_S)  # running already
    with pytest.raises(DuplicateActiveJob):  # an active twin, as a queued one would be
        await store.insert_job(new_job(key="k"), TTL_S)
    assert await store.record_process(job.id, OWNER, 4242, 4242, 1.0)
    assert await store.complete(job.id, OWNER, done())
    assert (await get(store, job.id)).status is JobStatus.COMPLETED


async def test_mark_running_refuses_another_owner_a_running_row_and_a_terminal_row(
    store: JobStore,
) -> None:
    job = new_job()
    await store.insert_job(job, TTL_S)
    assert not await store.mark_running(job.id, OTHER, TTL_S)
    assert (await get(store, job.id)).status is JobStatus.QUEUED
    assert await store.mark_running(job.id, OWNER, TTL_S)
    started = (await get(store, job.id)).started_at
    await wait_for_store_time(store, epoch(started) + PAST_S)
    assert not await store.mark_running(job.id, OWNER, TTL_S)  # already running
    assert (await get(store, job.id)).started_at == started
    assert await store.complete(job.id, OWNER, done())
    assert not await store.mark_running(job.id, OWNER, TTL_S)
    assert not await store.mark_running("no-such-job", OWNER, TTL_S)


async def test_a_job_orphaned_while_queued_is_never_launched_by_its_revived_owner(
    store: JobStore,
) -> None:
    row = await orphaned(store, new_job(), run=False)
    assert not await store.mark_running(row.id, OWNER, TTL_S)
    assert (await get(store, row.id)).status is JobStatus.ORPHANED


async def test_record_process_stamps_only_a_running_row_of_its_owner(store: JobStore) -> None:
    job = new_job()
    await store.insert_job(job, TTL_S)
    assert not await store.record_process(job.id, OWNER, 10, 10, 10.5)  # still queued
    assert await store.mark_running(job.id, OWNER, TTL_S)
    assert not await store.record_process(job.id, OTHER, 11, 11, 11.5)
    assert await store.record_process(job.id, OWNER, 12, 12, 12.5)
    row = await get(store, job.id)
    assert (row.pid, row.pgid, row.pid_started_at) == (12, 12, 12.5)
    assert await store.complete(job.id, OWNER, done())
    assert not await store.record_process(job.id, OWNER, 13, 13, 13.5)
    assert not await store.record_process("no-such-job", OWNER, 13, 13, 13.5)


async def test_complete_writes_the_outcome_and_ends_the_lease(store: JobStore) -> None:
    job = await running(store, new_job())
    before = await store.now()
    completion = Completion(
        status=JobStatus.FAILED, exit_code=3, error="it broke", error_kind="provider_error",
        output="partial", stderr_tail="trace", output_bytes=7, truncated=True,
        result_json='{"text": "partial"}',
    )
    assert await store.complete(job.id, OWNER, completion)
    row = await get(store, job.id)
    assert row.status is JobStatus.FAILED
    assert (row.exit_code, row.error, row.error_kind) == (3, "it broke", "provider_error")
    assert (row.output, row.stderr_tail, row.output_bytes, row.truncated) == (
        "partial", "trace", 7, True,
    )
    assert row.result_json == '{"text": "partial"}'
    assert epoch(row.finished_at) >= before - 1e-3
    assert row.lease_deadline is None


async def test_complete_returns_the_terminal_row_as_a_light_read_gives_it(
        store: JobStore) -> None:
    # A sync request answers from it instead of reading the row again (issue #26): it must be
    # the row as stored, cancelled-wins and the store's finish time included.
    job = await running(store, new_job())
    await store.request_cancel(job.id)
    written = await store.complete(job.id, OWNER, done(
        JobStatus.COMPLETED, output="the answer", result_json='{"text": "the answer"}'))
    assert written is not None and written.status is JobStatus.CANCELLED
    assert written == await store.get_job(job.id, with_output=False)
    assert written.finished_at is not None and written.output != "the answer"


async def test_complete_applies_to_a_queued_row(store: JobStore) -> None:
    job = new_job()
    await store.insert_job(job, TTL_S)
    assert await store.complete(job.id, OWNER, done(JobStatus.FAILED, error_kind="launch_failed"))
    assert (await get(store, job.id)).status is JobStatus.FAILED


@pytest.mark.parametrize("first", sorted(
    [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT]
))
async def test_a_terminal_row_never_changes_again(store: JobStore, first: JobStatus) -> None:
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(first, output="first"))
    settled = await get(store, job.id)
    for late in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED):
        assert not await store.complete(job.id, OWNER, done(late, output="late"))
        assert not await store.complete(job.id, OTHER, done(late, output="late"))
    assert not await store.save_progress(job.id, OWNER, Progress(1, "late"))
    assert await reap(store, 0) == []
    assert await get(store, job.id) == settled


async def test_complete_of_an_unknown_job_applies_nothing(store: JobStore) -> None:
    assert not await store.complete("no-such-job", OWNER, done())


async def test_cancelled_wins_over_a_late_completion(store: JobStore) -> None:
    job = await running(store, new_job())
    requested = await store.request_cancel(job.id)
    assert requested is not None and requested.cancel_requested_at is not None
    assert await store.complete(job.id, OWNER, done(JobStatus.COMPLETED, output="answer"))
    row = await get(store, job.id)
    assert row.status is JobStatus.CANCELLED
    assert row.error_kind == "cancelled"
    assert row.output == "answer"  # what the run printed is kept
    assert row.cancel_requested_at == requested.cancel_requested_at


async def test_an_orphaned_job_self_heals_for_its_owner_but_not_for_another_instance(
    store: JobStore,
) -> None:
    row = await orphaned(store, new_job())
    assert row.status is JobStatus.ORPHANED

    assert not await store.complete(row.id, OTHER, done(output="stolen"))
    assert await get(store, row.id) == row

    assert await store.complete(row.id, OWNER, done(output="healed"))
    healed = await get(store, row.id)
    assert (healed.status, healed.output) == (JobStatus.COMPLETED, "healed")
    assert not await store.complete(row.id, OWNER, done(JobStatus.FAILED))  # now final


async def test_an_orphaned_job_with_a_cancel_request_self_heals_as_cancelled(
    store: JobStore,
) -> None:
    job = new_job()
    await store.insert_job(job, EXPIRED_TTL_S)
    assert await store.mark_running(job.id, OWNER, EXPIRED_TTL_S)
    await store.request_cancel(job.id)
    await reap(store, HTTP_GRACE_S)
    assert (await get(store, job.id)).status is JobStatus.ORPHANED
    assert await store.complete(job.id, OWNER, done())
    assert (await get(store, job.id)).status is JobStatus.CANCELLED


# -- cancel -------------------------------------------------------------------------------

async def test_request_cancel_marks_an_active_row_once(store: JobStore) -> None:
    job = await running(store, new_job())
    first = await store.request_cancel(job.id)
    assert first is not None and first.status is JobStatus.RUNNING
    assert first.cancel_requested_at is not None
    await wait_for_store_time(store, epoch(first.cancel_requested_at) + 0.05)
    second = await store.request_cancel(job.id)
    assert second is not None and second.cancel_requested_at == first.cancel_requested_at


async def test_request_cancel_leaves_a_finished_row_alone_and_ignores_unknown_ids(
    store: JobStore,
) -> None:
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done())
    row = await store.request_cancel(job.id)
    assert row is not None
    assert (row.status, row.cancel_requested_at) == (JobStatus.COMPLETED, None)
    assert await store.request_cancel("no-such-job") is None


async def test_list_cancel_requested_names_only_this_instances_active_cancelled_jobs(
    store: JobStore,
) -> None:
    queued = new_job()
    await store.insert_job(queued, TTL_S)
    busy = await running(store, new_job())
    untouched = await running(store, new_job())
    foreign = await running(store, new_job(owner=OTHER))
    settled = await running(store, new_job())
    for job_id in (queued.id, busy.id, foreign.id, settled.id):
        await store.request_cancel(job_id)
    assert await store.complete(settled.id, OWNER, done())

    assert sorted(await store.list_cancel_requested(OWNER)) == sorted([queued.id, busy.id])
    assert await store.list_cancel_requested(OTHER) == [foreign.id]
    assert untouched.id not in await store.list_cancel_requested(OWNER)
    assert await store.list_cancel_requested("nobody") == []


# -- progress -----------------------------------------------------------------------------

async def test_save_progress_writes_only_while_running_and_owned(store: JobStore) -> None:
    job = new_job()
    await store.insert_job(job, TTL_S)
    assert not await store.save_progress(job.id, OWNER, Progress(1, "too early"))
    assert await store.mark_running(job.id, OWNER, TTL_S)
    assert not await store.save_progress(job.id, OTHER, Progress(2, "not mine"))
    assert await store.save_progress(job.id, OWNER, Progress(12, "hello world!", "warn"))
    row = await get(store, job.id)
    assert (row.status, row.output_bytes, row.output, row.stderr_tail) == (
        JobStatus.RUNNING, 12, "hello world!", "warn",
    )
    assert not await store.save_progress("no-such-job", OWNER, Progress(1, "x"))
