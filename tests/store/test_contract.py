"""The JobStore contract: the same test bodies run on memory, SQLite and PostgreSQL.

Every rule of `gateway/store/base.py` is pinned here, including races between two real
connections to the same storage (`second_store`). Time rules use the store's own clock
(`store.now()`): a test waits until that clock has passed a moment, never a fixed sleep.
A lease written with a negative ttl is one that is already over, so expiry needs no wait.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.model import (
    OUTPUT_CHUNK_BYTES,
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    OutputFile,
    OutputFileError,
    Progress,
)
from gateway.store.base import SCHEMA_VERSION, DuplicateActiveJob, JobStore, TakeOver

pytestmark = pytest.mark.anyio

OWNER = "instance-a"
OTHER = "instance-b"
TTL_S = 60.0  # a lease that cannot run out during a test
EXPIRED_TTL_S = -5.0  # a lease that is already over when written: expiry without waiting
HTTP_GRACE_S = 60.0  # an http job whose lease lapsed is still inside this grace
PAST_S = 0.3  # how far a test lets the store clock move past a moment before comparing
WINDOW_S = 0.15  # a window/threshold shorter than PAST_S, so that moment is outside it
RACE_ROUNDS = 100  # iterations of each two-connection race
RACE_TTL_S = 0.5  # the lease in the heartbeat-vs-reaper race: short, so expiry is real
RACE_HEARTBEAT_EVERY_S = 0.05  # the racing owner heartbeats ten times per ttl
RACE_RECOVER_EVERY_S = 0.005  # the racing reaper sweeps as often as it can
RACE_LIMIT_S = 60.0  # a race that takes longer than this is a hang
STORE_TIME_POLL_S = 0.02  # how often a wait re-reads the store clock
STORE_TIME_WAIT_LIMIT_S = 10.0  # a wait for the store clock that takes longer is a hang


# -- helpers ------------------------------------------------------------------------------

def new_job(
    *, owner: str = OWNER, key: str | None = None, provider: str = "claude",
    transport: str = "process", forced: bool = False, principal: str | None = None,
) -> NewJob:
    return NewJob(
        id=str(uuid.uuid4()),
        provider=provider,
        request_key=key or f"key-{uuid.uuid4().hex}",
        owner_instance=owner,
        transport=transport,
        correlation_id=f"corr-{uuid.uuid4().hex[:8]}",
        hostname="host-1",
        boot_id="boot-1",
        working_dir="/tmp/work",
        model="model-x",
        session_id="session-1",
        request_json='{"prompt": "hi"}',
        forced=forced,
        principal=principal,
    )


def instance(instance_id: str, **changes: object) -> InstanceRow:
    row = InstanceRow(
        instance_id=instance_id, hostname="host-1", boot_id="boot-1", pid=4242,
        pid_started_at=1_700_000_000.5, role="stdio", version="0.1.0",
    )
    for name, value in changes.items():
        setattr(row, name, value)
    return row


def done(status: JobStatus = JobStatus.COMPLETED, **changes: object) -> Completion:
    completion = Completion(status=status, exit_code=0 if status is JobStatus.COMPLETED else 1)
    for name, value in changes.items():
        setattr(completion, name, value)
    return completion


def epoch(moment: datetime | None) -> float:
    assert moment is not None
    offset = moment.utcoffset()
    assert offset is not None and offset.total_seconds() == 0
    return moment.timestamp()


async def wait_for_store_time(store: JobStore, target_epoch_s: float) -> None:
    """Wait until the store's own clock has passed `target_epoch_s` (bounded)."""
    with anyio.fail_after(STORE_TIME_WAIT_LIMIT_S):
        while await store.now() <= target_epoch_s:
            await anyio.sleep(STORE_TIME_POLL_S)


async def running(store: JobStore, job: NewJob, ttl_s: float = TTL_S) -> JobRow:
    await store.insert_job(job, ttl_s)
    assert await store.mark_running(job.id, job.owner_instance, ttl_s)
    assert await store.record_process(job.id, job.owner_instance, 100, 100, 1.5)
    row = await store.get_job(job.id)
    assert row is not None
    return row


async def get(store: JobStore, job_id: str) -> JobRow:
    row = await store.get_job(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row


async def reap(store: JobStore, http_grace_s: float, alive: Sequence[str] = (),
               orphaned_by: str | None = None) -> list[JobRow]:
    """One sweep as the reaper does it: list the candidates, then orphan those judged (all
    but the `alive` ones), by a reaper of host `orphaned_by`."""
    candidates = await store.list_expired_candidates(http_grace_s)
    judged = [row.id for row in candidates if row.id not in alive]
    return await store.recover_expired_leases(http_grace_s, judged, orphaned_by)


async def orphaned(store: JobStore, job: NewJob, *, run: bool = True) -> JobRow:
    """A job whose lease ran out and that the reaper recovered."""
    await store.insert_job(job, EXPIRED_TTL_S)
    if run:
        assert await store.mark_running(job.id, job.owner_instance, EXPIRED_TTL_S)
    flipped = await reap(store, HTTP_GRACE_S)
    assert job.id in {r.id for r in flipped}
    return await get(store, job.id)


async def output_page(store: JobStore, job_id: str, offset: int, length: int, *,
                      answer: bool = False) -> tuple[bytes, int]:
    """A page of a job whose output the test wrote (absent output fails the test here)."""
    page = await store.read_output(job_id, offset, length, answer=answer)
    assert page is not None, f"job {job_id} has no output"
    return page


async def race(round_no: int, one: Callable[[], Coroutine[Any, Any, None]],
               other: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run both at once, started in the one order on odd rounds and the other on even."""
    async with anyio.create_task_group() as tg:
        for task in (one, other) if round_no % 2 else (other, one):
            tg.start_soon(task)


# -- the protocol itself ------------------------------------------------------------------

PROTOCOL_METHODS = sorted(
    name for name, member in vars(JobStore).items() if inspect.iscoroutinefunction(member)
)


async def test_backend_implements_every_protocol_method_with_its_signature(
    store: JobStore, store_target: object
) -> None:
    assert isinstance(store, JobStore)
    assert store.backend == store_target.backend  # type: ignore[attr-defined]
    for name in PROTOCOL_METHODS:
        implementation = getattr(type(store), name, None)
        assert implementation is not None, f"{store.backend} lacks {name}"
        assert inspect.iscoroutinefunction(implementation), f"{name} must be async"
        wanted = list(inspect.signature(getattr(JobStore, name)).parameters)
        assert list(inspect.signature(implementation).parameters) == wanted, name


async def test_open_store_migrates_to_the_current_schema_version(store: JobStore) -> None:
    assert await store.schema_version() == SCHEMA_VERSION


async def test_ten_stores_opening_fresh_storage_at_once_all_migrate_it_and_reopening_is_a_no_op(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    """Concurrent first opens (ten windows starting together) must all succeed: SQLite
    serializes them with BEGIN IMMEDIATE, PostgreSQL with an advisory lock; without it,
    concurrent CREATE TABLE IF NOT EXISTS races on the catalog and two openers insert the
    same schema_version row. A late opener then finds nothing to do."""
    opened: list[JobStore] = []

    async def open_one() -> None:
        opened.append(await store_factory())

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(open_one)
    late = await store_factory()
    for store in [*opened, late]:
        assert await store.schema_version() == SCHEMA_VERSION


async def test_store_clock_is_epoch_seconds_close_to_this_host(store: JobStore) -> None:
    # Same host in tests: the database clock and ours agree to within a few seconds.
    assert abs(await store.now() - datetime.now(UTC).timestamp()) < 5


# -- instances ----------------------------------------------------------------------------

async def test_register_instance_stamps_heartbeat_and_lease_from_the_store_clock(
    store: JobStore,
) -> None:
    before = await store.now()
    await store.register_instance(instance(OWNER), TTL_S)
    after = await store.now()
    (row,) = await store.list_instances()
    assert (row.instance_id, row.hostname, row.boot_id, row.pid, row.role, row.version) == (
        OWNER, "host-1", "boot-1", 4242, "stdio", "0.1.0",
    )
    assert row.pid_started_at == pytest.approx(1_700_000_000.5)
    assert before - 1e-3 <= epoch(row.heartbeat_at) <= after + 1e-3
    assert epoch(row.lease_expires_at) == pytest.approx(epoch(row.heartbeat_at) + TTL_S, abs=1e-3)
    assert row.started_at is not None and row.stopped_at is None


async def test_reregistering_a_stopped_instance_revives_it_and_keeps_its_start(
    store: JobStore,
) -> None:
    await store.register_instance(instance(OWNER), TTL_S)
    (first,) = await store.list_instances()
    await store.mark_instance_stopped(OWNER)
    (stopped,) = await store.list_instances()
    assert stopped.stopped_at is not None

    await store.register_instance(instance(OWNER, pid=999), TTL_S)
    (again,) = await store.list_instances()
    assert again.stopped_at is None
    assert again.pid == 999
    assert epoch(again.started_at) == pytest.approx(epoch(first.started_at), abs=1e-3)
    assert epoch(again.heartbeat_at) >= epoch(first.heartbeat_at)


async def test_mark_instance_stopped_keeps_the_first_stop_time(store: JobStore) -> None:
    await store.register_instance(instance(OWNER), TTL_S)
    await store.mark_instance_stopped(OWNER)
    (first,) = await store.list_instances()
    await wait_for_store_time(store, epoch(first.stopped_at) + 0.05)
    await store.mark_instance_stopped(OWNER)
    (second,) = await store.list_instances()
    assert epoch(second.stopped_at) == pytest.approx(epoch(first.stopped_at), abs=1e-3)
    await store.mark_instance_stopped("no-such-instance")  # harmless


async def test_heartbeat_renews_only_its_own_instance_row_and_writes_no_job(
    store: JobStore,
) -> None:
    """The heartbeat's cost must not grow with the job count: it renews one row, the
    instance's, and leaves every job row as it was."""
    await store.register_instance(instance(OWNER), 1.0)
    await store.register_instance(instance(OTHER), 1.0)
    queued = await store.insert_job(new_job(), 1.0)
    running_row = await running(store, new_job(), ttl_s=1.0)

    before = await store.now()
    assert await store.heartbeat(OWNER, TTL_S) == 1

    for row in (queued, running_row):
        after = await get(store, row.id)
        assert after.updated_at == row.updated_at and after.lease_deadline == row.lease_deadline
    rows = {r.instance_id: r for r in await store.list_instances()}
    assert epoch(rows[OWNER].lease_expires_at) >= before + TTL_S - 1e-3
    assert epoch(rows[OTHER].lease_expires_at) < before + TTL_S - 1


async def test_a_live_owners_lease_covers_jobs_whose_own_deadline_passed(
    store: JobStore,
) -> None:
    """A job's lease is the later of its own deadline and its owner's instance lease: jobs
    of a heartbeating owner stay; the same jobs of a lapsed or unknown owner are orphaned."""
    await store.register_instance(instance(OWNER), TTL_S)
    await store.register_instance(instance(OTHER), EXPIRED_TTL_S)
    kept = [await running(store, new_job(), ttl_s=EXPIRED_TTL_S),
            await running(store, new_job(transport="http"), ttl_s=EXPIRED_TTL_S)]
    lapsed = await running(store, new_job(owner=OTHER), ttl_s=EXPIRED_TTL_S)
    unknown = await running(store, new_job(owner="collected-instance"), ttl_s=EXPIRED_TTL_S)

    candidates = {r.id for r in await store.list_expired_candidates(0)}
    flipped = {r.id for r in await reap(store, 0)}

    assert candidates == flipped == {lapsed.id, unknown.id}
    for row in kept:
        assert (await get(store, row.id)).status is JobStatus.RUNNING


async def test_an_http_job_keeps_its_grace_after_its_owners_lease(store: JobStore) -> None:
    """http jobs get http_grace_s on top of whichever lease is later, the owner's included."""
    await store.register_instance(instance(OTHER), EXPIRED_TTL_S)
    job = await running(store, new_job(owner=OTHER, transport="http"), ttl_s=EXPIRED_TTL_S)
    (owner,) = await store.list_instances()
    lapsed_by = await store.now() - epoch(owner.lease_expires_at)
    assert await reap(store, lapsed_by * 4) == []
    assert [r.id for r in await reap(store, lapsed_by / 4)] == [job.id]


async def test_heartbeat_of_an_unknown_instance_renews_nothing_and_says_so(
    store: JobStore,
) -> None:
    assert await store.heartbeat("never-registered", TTL_S) == 0


async def test_heartbeat_never_revives_a_job_the_reaper_already_orphaned(
    store: JobStore,
) -> None:
    await store.register_instance(instance(OWNER), EXPIRED_TTL_S)
    row = await orphaned(store, new_job())
    assert await store.heartbeat(OWNER, TTL_S) == 1
    after = await get(store, row.id)
    assert after.status is JobStatus.ORPHANED and after.lease_deadline is None


async def test_gc_instances_removes_only_stopped_or_expired_rows_past_the_threshold(
    store: JobStore,
) -> None:
    await store.register_instance(instance("expired"), EXPIRED_TTL_S)
    await store.register_instance(instance("stopped"), TTL_S)
    await store.mark_instance_stopped("stopped")
    await store.register_instance(instance("live"), TTL_S)
    rows = {r.instance_id: r for r in await store.list_instances()}
    await wait_for_store_time(store, epoch(rows["stopped"].stopped_at) + PAST_S)

    assert await store.gc_instances(3600) == 0  # nothing has been gone that long
    assert {r.instance_id for r in await store.list_instances()} == {"expired", "stopped", "live"}

    # A row that went away just now is younger than the threshold and stays.
    await store.register_instance(instance("fresh-stop"), TTL_S)
    await store.mark_instance_stopped("fresh-stop")

    assert await store.gc_instances(WINDOW_S) == 2
    assert {r.instance_id for r in await store.list_instances()} == {"live", "fresh-stop"}


async def test_gc_instances_with_a_host_collects_only_its_lapsed_rows_not_kept_alive(
    store: JobStore,
) -> None:
    # Issue 23, item 5: a lapsed row is collected only by a gateway of its host, and never
    # one it found alive (a SIGSTOPped owner); a stopped row goes whatever its host.
    await store.register_instance(instance("dead-here"), EXPIRED_TTL_S)
    await store.register_instance(instance("stopped-alive-here"), EXPIRED_TTL_S)
    await store.register_instance(instance("elsewhere", hostname="host-2"), EXPIRED_TTL_S)
    await store.register_instance(instance("left-elsewhere", hostname="host-2"), TTL_S)
    await store.mark_instance_stopped("left-elsewhere")
    rows = {r.instance_id: r for r in await store.list_instances()}
    await wait_for_store_time(store, epoch(rows["left-elsewhere"].stopped_at) + PAST_S)

    assert await store.gc_instances(WINDOW_S, "host-1", ["stopped-alive-here"]) == 2
    assert {r.instance_id for r in await store.list_instances()} == {
        "stopped-alive-here", "elsewhere"}


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


# -- the reaper ---------------------------------------------------------------------------

async def test_list_expired_candidates_is_read_only_and_honours_the_http_grace(
    store: JobStore,
) -> None:
    expired = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    expired_queued = new_job()
    await store.insert_job(expired_queued, EXPIRED_TTL_S)
    live = await running(store, new_job())
    http_in_grace = await running(store, new_job(transport="http"), ttl_s=EXPIRED_TTL_S)

    ids = {r.id for r in await store.list_expired_candidates(HTTP_GRACE_S)}
    assert ids == {expired.id, expired_queued.id}
    ids = {r.id for r in await store.list_expired_candidates(abs(EXPIRED_TTL_S) / 2)}
    assert ids == {expired.id, expired_queued.id, http_in_grace.id}
    assert live.id not in ids
    for job_id in (expired.id, expired_queued.id, http_in_grace.id):
        assert (await get(store, job_id)).status.is_active  # nothing was flipped


async def test_recover_expired_leases_returns_exactly_the_rows_it_flipped(
    store: JobStore,
) -> None:
    expired = [await running(store, new_job(), ttl_s=EXPIRED_TTL_S) for _ in range(3)]
    queued = new_job()
    await store.insert_job(queued, EXPIRED_TTL_S)
    live = await running(store, new_job())
    live_queued = new_job()
    await store.insert_job(live_queued, TTL_S)
    finished = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    assert await store.complete(finished.id, OWNER, done())
    http_in_grace = await running(store, new_job(transport="http"), ttl_s=EXPIRED_TTL_S)

    flipped = await reap(store, HTTP_GRACE_S)

    wanted = {r.id for r in expired} | {queued.id}
    assert {r.id for r in flipped} == wanted
    assert len(flipped) == len(wanted)
    for row in flipped:
        assert row.status is JobStatus.ORPHANED
        assert row.error_kind == "orphaned" and row.error
        assert row.finished_at is not None and row.lease_deadline is None
        stored = await get(store, row.id)
        assert (stored.status, stored.error, stored.finished_at, stored.owner_instance) == (
            row.status, row.error, row.finished_at, row.owner_instance)
    assert (await get(store, live.id)).status is JobStatus.RUNNING
    assert (await get(store, live_queued.id)).status is JobStatus.QUEUED
    assert (await get(store, finished.id)).status is JobStatus.COMPLETED
    assert (await get(store, http_in_grace.id)).status is JobStatus.RUNNING
    assert await reap(store, HTTP_GRACE_S) == []  # nothing left to flip


async def test_recover_expired_leases_spares_jobs_proven_alive(store: JobStore) -> None:
    alive = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    dead = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    flipped = await reap(store, HTTP_GRACE_S, alive=[alive.id, "unknown"])
    assert [r.id for r in flipped] == [dead.id]
    assert (await get(store, alive.id)).status is JobStatus.RUNNING
    assert [r.id for r in await reap(store, HTTP_GRACE_S)] == [alive.id]


async def test_reaper_orphans_only_the_candidates_it_listed_and_judged(
    store: JobStore,
) -> None:
    """Regression (issue 15, item 11): the UPDATE flipped every row expired at write time
    except the proven-alive ones, including rows the reaper never listed nor probed."""
    judged = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    never_listed = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
    live = await running(store, new_job())
    flipped = await store.recover_expired_leases(HTTP_GRACE_S, [judged.id, live.id, "unknown"])
    assert [r.id for r in flipped] == [judged.id]
    assert (await get(store, never_listed.id)).status is JobStatus.RUNNING
    assert (await get(store, live.id)).status is JobStatus.RUNNING  # listed but not expired
    assert await store.recover_expired_leases(HTTP_GRACE_S, []) == []
    assert (await get(store, never_listed.id)).status is JobStatus.RUNNING


async def test_reaper_reads_are_bounded_per_sweep_and_the_rest_come_next_sweep(
    store: JobStore,
) -> None:
    """Regression (issue 15, item 11): the candidate read was unbounded."""
    expired = [await running(store, new_job(), ttl_s=EXPIRED_TTL_S - n) for n in range(5)]
    oldest_first = [row.id for row in reversed(expired)]
    first = await store.list_expired_candidates(HTTP_GRACE_S, limit=2)
    assert [r.id for r in first] == oldest_first[:2]
    await store.recover_expired_leases(HTTP_GRACE_S, [r.id for r in first])
    second = await store.list_expired_candidates(HTTP_GRACE_S, limit=2)
    assert [r.id for r in second] == oldest_first[2:4]


async def test_reaper_reads_carry_neither_the_request_nor_the_output(store: JobStore) -> None:
    """Regression (issue 15, item 11): the reaper read whole rows (requests up to 1 MiB,
    output tails); it reads what it probes and logs, nothing else."""
    job = dataclasses.replace(new_job(), request_json=json.dumps({"prompt": "p" * 100_000}))
    await running(store, job, ttl_s=EXPIRED_TTL_S)
    assert await store.save_progress(job.id, OWNER, Progress(50_000, "o" * 50_000, "e" * 100))
    (candidate,) = await store.list_expired_candidates(HTTP_GRACE_S)
    assert (candidate.request_json, candidate.output, candidate.stderr_tail) == ("{}", None, None)
    assert (candidate.id, candidate.owner_instance, candidate.hostname, candidate.boot_id,
            candidate.pid, candidate.pid_started_at, candidate.provider) == (
        job.id, OWNER, "host-1", "boot-1", 100, 1.5, "claude")
    (flipped,) = await store.recover_expired_leases(HTTP_GRACE_S, [job.id])
    assert (flipped.status, flipped.error_kind, flipped.request_json, flipped.output) == (
        JobStatus.ORPHANED, "orphaned", "{}", None)


async def test_an_http_job_is_orphaned_only_after_its_lease_plus_the_grace(
    store: JobStore,
) -> None:
    http_job = await running(store, new_job(transport="http"), ttl_s=EXPIRED_TTL_S)
    lapsed_by = abs(EXPIRED_TTL_S)
    assert await reap(store, lapsed_by * 4) == []
    flipped = await reap(store, lapsed_by / 4)
    assert [r.id for r in flipped] == [http_job.id]


async def test_an_http_job_lease_really_expires_with_the_store_clock(store: JobStore) -> None:
    http_job = await running(store, new_job(transport="http"), ttl_s=WINDOW_S)
    process_job = await running(store, new_job(), ttl_s=WINDOW_S)
    assert await reap(store, WINDOW_S) == []  # nothing lapsed yet
    await wait_for_store_time(store, epoch(http_job.lease_deadline) + WINDOW_S + 0.05)
    await wait_for_store_time(store, epoch(process_job.lease_deadline) + 0.05)
    flipped = await reap(store, 3600)
    assert [r.id for r in flipped] == [process_job.id]
    flipped = await reap(store, WINDOW_S)
    assert [r.id for r in flipped] == [http_job.id]


# -- retention and reads ------------------------------------------------------------------

async def test_purge_terminal_deletes_only_terminal_rows_past_retention(store: JobStore) -> None:
    old_done = await running(store, new_job())
    assert await store.complete(old_done.id, OWNER, done())
    old_orphan = await orphaned(store, new_job())
    old_active = new_job()
    await store.insert_job(old_active, TTL_S)
    await store.insert_job(new_job(), EXPIRED_TTL_S)  # expired but never recovered: active
    mark = await get(store, old_done.id)
    orphan_row = await get(store, old_orphan.id)
    await wait_for_store_time(
        store, max(epoch(mark.finished_at), epoch(orphan_row.finished_at)) + PAST_S
    )
    fresh_done = await running(store, new_job())
    assert await store.complete(fresh_done.id, OWNER, done(JobStatus.FAILED))

    assert await store.purge_terminal(3600) == []
    assert sorted(await store.purge_terminal(WINDOW_S)) == sorted([old_done.id, old_orphan.id])
    assert await store.get_job(old_done.id) is None
    assert await store.get_job(old_orphan.id) is None
    assert (await get(store, old_active.id)).status is JobStatus.QUEUED
    assert (await get(store, fresh_done.id)).status is JobStatus.FAILED
    assert len(await store.list_jobs()) == 3


async def test_purge_terminal_deletes_a_bounded_batch(store: JobStore) -> None:
    ended = []
    for _ in range(3):
        job = await running(store, new_job())
        assert await store.complete(job.id, OWNER, done())
        ended.append(await get(store, job.id))
    await wait_for_store_time(store, max(epoch(j.finished_at) for j in ended) + PAST_S)
    first = await store.purge_terminal(WINDOW_S, limit=2)
    second = await store.purge_terminal(WINDOW_S, limit=2)  # fewer than the limit: all gone
    assert (len(first), len(second)) == (2, 1)
    assert sorted(first + second) == sorted(j.id for j in ended)
    assert await store.purge_terminal(WINDOW_S, limit=2) == []


async def test_find_job_ids_matches_a_prefix_literally_sorted_and_bounded(
    store: JobStore,
) -> None:
    ids = ["abc12345-0000", "abc12345-1111", "abd00000-0000", "ab%_x-0000", "ABC12345-2222"]
    for job_id in ids:
        job = new_job()
        job.id = job_id
        await store.insert_job(job, TTL_S)

    assert await store.find_job_ids("abc1") == ["abc12345-0000", "abc12345-1111"]
    assert await store.find_job_ids("abc12345-1111") == ["abc12345-1111"]  # a whole id
    assert await store.find_job_ids("abc", limit=1) == ["abc12345-0000"]
    assert await store.find_job_ids("ABC") == ["ABC12345-2222"]  # case-sensitive
    # LIKE's wildcards are characters here: `_` is not "any one", `%` not "anything".
    assert await store.find_job_ids("ab_") == []
    assert await store.find_job_ids("ab%") == ["ab%_x-0000"]
    assert await store.find_job_ids("ab%_") == ["ab%_x-0000"]
    assert await store.find_job_ids("zzz") == []
    assert await store.find_job_ids("") == []


async def test_get_job_of_an_unknown_id_is_none(store: JobStore) -> None:
    assert await store.get_job("no-such-job") is None


async def test_list_jobs_filters_and_lists_newest_first(store: JobStore) -> None:
    a = await store.insert_job(new_job(provider="claude"), TTL_S)
    b = await running(store, new_job(provider="codex"))
    c = await running(store, new_job(provider="claude", owner=OTHER))
    assert await store.complete(c.id, OTHER, done())
    d = await store.insert_job(new_job(provider="gemini", owner=OTHER), TTL_S)

    assert [r.id for r in await store.list_jobs()] == [d.id, c.id, b.id, a.id]
    assert [r.id for r in await store.list_jobs(limit=2)] == [d.id, c.id]
    assert [r.id for r in await store.list_jobs(provider="claude")] == [c.id, a.id]
    assert [r.id for r in await store.list_jobs(owner_instance=OTHER)] == [d.id, c.id]
    assert [r.id for r in await store.list_jobs(statuses=[JobStatus.QUEUED])] == [d.id, a.id]
    active = await store.list_jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING])
    assert [r.id for r in active] == [d.id, b.id, a.id]
    both = await store.list_jobs(
        statuses=[JobStatus.QUEUED], provider="claude", owner_instance=OWNER
    )
    assert [r.id for r in both] == [a.id]
    assert await store.list_jobs(provider="nobody") == []


async def test_list_jobs_filters_by_principal_before_the_limit_so_a_page_is_full(
    store: JobStore,
) -> None:
    # #23: a listing filtered after the LIMIT came back short (or empty) when another
    # principal's jobs were newer; filtered in the query, each page is full.
    old = await store.insert_job(new_job(), TTL_S)  # from before schema 4: no principal
    mine = [await store.insert_job(new_job(principal="token:alice"), TTL_S) for _ in range(3)]
    theirs = [await store.insert_job(new_job(principal="token:bob"), TTL_S) for _ in range(4)]

    page = await store.list_jobs(principal="token:alice", limit=2)
    assert [r.id for r in page] == [mine[2].id, mine[1].id]
    everything = await store.list_jobs(principal="token:alice", limit=10, with_output=False)
    assert [r.id for r in everything] == [j.id for j in reversed(mine)]
    with_old = await store.list_jobs(principal="token:alice", unowned_too=True, limit=10)
    assert [r.id for r in with_old] == [j.id for j in reversed(mine)] + [old.id]
    assert [r.id for r in await store.list_jobs(principal="local", unowned_too=True)] == [old.id]
    bobs = await store.list_jobs(principal="token:bob", provider="claude", limit=4)
    assert [r.id for r in bobs] == [j.id for j in reversed(theirs)]
    assert len(await store.list_jobs(limit=100)) == 8  # no principal: every job


async def test_a_light_read_leaves_out_the_output_and_the_answer_text_only(
    store: JobStore,
) -> None:
    # Status, wait, list and cancel read rows whose output (and parsed answer, which is
    # output too) can be max_output_bytes; they need neither, so neither is read.
    answer = {"text": "the answer é", "session_id": "native-1",
              "usage": {"input_tokens": 3}, "duration_s": 1.25, "extra": {"k": "\u0000"}}
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        output="raw stdout é", output_bytes=14, stderr_tail="trace",
        result_json=json.dumps(answer, sort_keys=True, separators=(",", ":"))))
    queued = await store.insert_job(new_job(), TTL_S)
    weird = await running(store, new_job())  # result_json that is not JSON: kept as it is
    assert await store.complete(weird.id, OWNER, done(output="out", result_json="not json"))

    full = await get(store, job.id)
    light = await store.get_job(job.id, with_output=False)
    assert light is not None and light.output is None
    assert light.result_json is not None
    assert json.loads(light.result_json) == {k: v for k, v in answer.items() if k != "text"}
    assert dataclasses.replace(light, output=full.output, result_json=full.result_json) == full
    assert await store.get_job("no-such-job", with_output=False) is None

    light_queued = await store.get_job(queued.id, with_output=False)
    assert light_queued == await get(store, queued.id)  # nothing to leave out
    light_weird = await store.get_job(weird.id, with_output=False)
    assert light_weird is not None
    assert (light_weird.output, light_weird.result_json) == (None, "not json")

    listed = {r.id: r for r in await store.list_jobs(with_output=False)}
    assert listed.keys() == {job.id, queued.id, weird.id}
    assert listed[job.id] == light and listed[weird.id] == light_weird
    assert [r.id for r in await store.list_jobs(with_output=False, limit=1)] == [weird.id]


async def test_dedup_lookup_and_cancel_answer_with_light_rows(store: JobStore) -> None:
    """Admission's dedup lookup and a cancel answer with a job's id and status: a finished
    job's output (up to max_output_bytes) is not read for them."""
    answer = {"text": "the answer", "session_id": "native-1"}
    job = await running(store, new_job(key="dedup-light"))
    assert await store.complete(job.id, OWNER, done(
        output="raw stdout", output_bytes=10,
        result_json=json.dumps(answer, sort_keys=True, separators=(",", ":"))))
    light = await store.get_job(job.id, with_output=False)

    reused = await store.find_reusable("dedup-light", 3600)
    after_cancel = await store.request_cancel(job.id)

    assert reused == light and after_cancel == light
    assert reused is not None and reused.output is None
    active = await running(store, new_job())
    cancelled = await store.request_cancel(active.id)
    assert cancelled is not None and cancelled.cancel_requested_at is not None
    assert cancelled == await store.get_job(active.id, with_output=False)


async def test_read_output_pages_the_output_or_the_answer_in_bytes(store: JobStore) -> None:
    output = "héllo wörld " * 1000  # multi-byte characters: offsets are bytes, not chars
    data = output.encode()
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        output=output, output_bytes=len(data),
        result_json=json.dumps({"text": "the ánswer", "session_id": None})))
    no_text = await running(store, new_job())
    assert await store.complete(no_text.id, OWNER, done(
        output="stdout only", result_json=json.dumps({"text": "", "session_id": "s"})))
    nothing = await store.insert_job(new_job(), TTL_S)

    assert await store.read_output(job.id, 0, 10) == (data[:10], len(data))
    assert await store.read_output(job.id, 2, 3) == (data[2:5], len(data))  # mid-character
    assert await store.read_output(job.id, len(data) - 4, 100) == (data[-4:], len(data))
    assert await store.read_output(job.id, len(data) + 5, 10) == (b"", len(data))
    pages = [(await output_page(store, job.id, off, 997))[0] for off in range(0, len(data), 997)]
    assert b"".join(pages) == data

    answer = "the ánswer".encode()
    assert await store.read_output(job.id, 0, 100, answer=True) == (answer, len(answer))
    assert await store.read_output(job.id, 5, 3, answer=True) == (answer[5:8], len(answer))
    # An empty answer text, or no row text at all, pages the output instead.
    assert await store.read_output(no_text.id, 0, 6, answer=True) == (b"stdout", 11)
    assert await store.read_output(nothing.id, 0, 10, answer=True) == (b"", 0)
    assert await store.read_output(nothing.id, 0, 10) == (b"", 0)
    assert await store.read_output("no-such-job", 0, 10) is None
    assert await store.read_output("no-such-job", 0, 10, answer=True) is None


async def test_an_answer_stored_as_a_range_of_the_output_pages_that_range(
    store: JobStore,
) -> None:
    # An answer that is (a slice of) the output is stored once: result_json names its bytes.
    output = "banner\nthe ánswer 𝄞\n\n"
    data = output.encode()
    start, end = 7, len("banner\nthe ánswer 𝄞".encode())
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output=output, result_json=json.dumps(
        {"text_span": [start, end], "session_id": "s", "extra": {"k": "\u0000"}})))
    answer = data[start:end]
    assert await store.read_output(job.id, 0, 100, answer=True) == (answer, len(answer))
    assert await store.read_output(job.id, 4, 3, answer=True) == (answer[4:7], len(answer))
    assert await store.read_output(job.id, 50, 3, answer=True) == (b"", len(answer))
    assert await store.read_output(job.id, 0, 100) == (data, len(data))  # raw: all of it
    pages = [(await output_page(store, job.id, off, 2, answer=True))[0]
             for off in range(0, len(answer), 2)]
    assert b"".join(pages) == answer
    # A range past the end is cut at the end; a range that is not one pages the output.
    for span, expected in (([start, 10_000], data[start:]), ([3, 3], data), (["a", 9], data),
                           ([-1, 4], data), ([2.5, 9], data)):
        odd = await running(store, new_job())
        assert await store.complete(odd.id, OWNER, done(
            output=output, result_json=json.dumps({"text_span": span})))
        assert await store.read_output(odd.id, 0, 100, answer=True) == (expected, len(expected))


def large_output(tmp_path: Path, name: str, size: int) -> tuple[str, OutputFile]:
    """A valid UTF-8 output of about `size` bytes, its characters of 1 to 4 bytes falling
    across every piece boundary, as an OutputFile."""
    unit = "ab é € 𝄞\n"
    text = unit * (size // len(unit.encode()) + 1)
    path = tmp_path / name
    path.write_bytes(text.encode())
    return text, OutputFile(path, path.stat().st_size)


async def test_a_large_output_is_written_in_pieces_and_reads_back_byte_exact(
    store: JobStore, tmp_path: Path,
) -> None:
    text, source = large_output(tmp_path, "stdout", 3 * OUTPUT_CHUNK_BYTES + 12_345)
    data = text.encode()
    assert not source.small
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        JobStatus.FAILED, error_kind="output_limit", output=source, output_bytes=len(data),
        truncated=True, result_json=json.dumps({"text_span": [3, len(data) - 1]})))

    row = await get(store, job.id)
    assert (row.status, row.truncated, row.output_bytes) == (JobStatus.FAILED, True, len(data))
    assert row.output == text
    light = await store.get_job(job.id, with_output=False)
    assert light is not None and light.output is None and light.truncated
    pages, offset = [], 0
    while offset < len(data):
        page, total = await store.read_output(job.id, offset, 300_007) or (b"", -1)
        assert total == len(data) and page
        pages.append(page)
        offset += len(page)
    assert b"".join(pages) == data
    assert await store.read_output(job.id, len(data) - 5, 100) == (data[-5:], len(data))
    answer = data[3:-1]
    assert await store.read_output(job.id, 0, 10, answer=True) == (answer[:10], len(answer))
    assert await store.read_output(job.id, len(answer) - 4, 10, answer=True) == (
        answer[-4:], len(answer))


async def test_a_large_output_that_loses_the_cas_changes_nothing(
    store: JobStore, tmp_path: Path,
) -> None:
    first_text, first = large_output(tmp_path, "first", 2 * OUTPUT_CHUNK_BYTES)
    _, late = large_output(tmp_path, "late", 2 * OUTPUT_CHUNK_BYTES + 99)
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output=first))
    assert not await store.complete(job.id, OWNER, done(JobStatus.FAILED, output=late))
    row = await get(store, job.id)
    assert (row.status, row.output) == (JobStatus.COMPLETED, first_text)


async def test_an_output_file_that_cannot_be_read_back_leaves_the_row_active(
    store: JobStore, tmp_path: Path,
) -> None:
    # The status and the output commit together or not at all.
    _, source = large_output(tmp_path, "stdout", 2 * OUTPUT_CHUNK_BYTES)
    job = await running(store, new_job())
    for broken in (OutputFile(source.path, source.size + 10),  # shorter than measured
                   OutputFile(tmp_path / "gone", source.size),
                   OutputFile(tmp_path / "gone", 10)):  # small: read whole, same rule
        with pytest.raises(OutputFileError):
            await store.complete(job.id, OWNER, done(output=broken))
        row = await get(store, job.id)
        assert (row.status, row.output, row.finished_at) == (JobStatus.RUNNING, None, None)
    assert await store.complete(job.id, OWNER, done(output=source))
    assert (await get(store, job.id)).output == source.text()


async def test_every_timestamp_comes_back_timezone_aware_utc(store: JobStore) -> None:
    await store.register_instance(instance(OWNER), TTL_S)
    await store.mark_instance_stopped(OWNER)
    job = await running(store, new_job())
    await store.request_cancel(job.id)
    queued = await store.insert_job(new_job(), TTL_S)
    assert await store.complete(job.id, OWNER, done())
    row = await get(store, job.id)
    for moment in (
        row.created_at, row.started_at, row.finished_at, row.updated_at,
        row.cancel_requested_at, queued.lease_deadline,
    ):
        epoch(moment)
    (inst,) = await store.list_instances()
    for moment in (inst.started_at, inst.heartbeat_at, inst.lease_expires_at, inst.stopped_at):
        epoch(moment)


# -- races between two real connections ---------------------------------------------------

async def test_a_job_whose_owner_keeps_heartbeating_is_never_orphaned(
    store: JobStore, second_store: JobStore
) -> None:
    """The lease invariant, raced: the owner heartbeats on one connection while a reaper on
    another sweeps in a loop. A flip is legal only if the owner's last heartbeat that had
    finished before the flip started more than a ttl earlier; a dead owner's job is flipped.
    """
    start = await store.now()
    beats: list[tuple[float, float]] = [(start, start)]  # (started, finished) of each beat
    await store.register_instance(instance(OWNER), RACE_TTL_S)
    live = [new_job() for _ in range(3)]
    for job in live:
        await store.insert_job(job, RACE_TTL_S)
    assert await store.mark_running(live[0].id, OWNER, RACE_TTL_S)
    dead = new_job(owner="instance-gone")
    await second_store.insert_job(dead, RACE_TTL_S)
    flips: list[JobRow] = []
    rounds = 0
    stop = anyio.Event()

    async def owner_heartbeats() -> None:
        while not stop.is_set():
            begun = await store.now()
            assert await store.heartbeat(OWNER, RACE_TTL_S) == 1
            beats.append((begun, await store.now()))
            await anyio.sleep(RACE_HEARTBEAT_EVERY_S)

    async def reaper_sweeps() -> None:
        nonlocal rounds
        until = start + 3 * RACE_TTL_S
        while rounds < RACE_ROUNDS or await second_store.now() < until:
            flips.extend(await reap(second_store, HTTP_GRACE_S))
            rounds += 1
            await anyio.sleep(RACE_RECOVER_EVERY_S)
        stop.set()

    with anyio.fail_after(RACE_LIMIT_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(owner_heartbeats)
            tg.start_soon(reaper_sweeps)

    live_ids = {job.id for job in live}
    for row in flips:
        if row.id not in live_ids:
            continue
        flipped_at = epoch(row.finished_at)
        last_beat_start = max(b for b, end in beats if end < flipped_at)
        assert flipped_at - last_beat_start > RACE_TTL_S, (
            f"{row.id} orphaned {flipped_at - last_beat_start:.3f}s after a heartbeat began"
        )
    assert dead.id in {row.id for row in flips}, "the dead owner's job was never orphaned"
    assert len(flips) == len({row.id for row in flips}), "a job was flipped twice"
    assert rounds >= RACE_ROUNDS


async def test_two_racing_inserts_of_one_request_key_leave_exactly_one_active_job(
    store: JobStore, second_store: JobStore
) -> None:
    for round_no in range(RACE_ROUNDS):
        key = f"race-{round_no}"
        jobs = [new_job(key=key), new_job(key=key, owner=OTHER)]
        forced = new_job(key=key, forced=True)
        outcome: dict[str, JobRow | DuplicateActiveJob] = {}

        async def insert(target: JobStore, job: NewJob) -> None:
            try:
                outcome[job.id] = await target.insert_job(job, TTL_S)
            except DuplicateActiveJob as exc:
                outcome[job.id] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(insert, store, jobs[0])
            tg.start_soon(insert, second_store, jobs[1])
            tg.start_soon(insert, second_store if round_no % 2 else store, forced)

        assert isinstance(outcome[forced.id], JobRow), "a forced insert was blocked"
        winners = [outcome[j.id] for j in jobs if isinstance(outcome[j.id], JobRow)]
        losers = [outcome[j.id] for j in jobs if isinstance(outcome[j.id], DuplicateActiveJob)]
        assert len(winners) == 1 and len(losers) == 1, outcome
        assert losers[0].existing_id == winners[0].id  # type: ignore[union-attr]
        reused = await store.find_reusable(key, 3600)
        assert reused is not None and reused.id == winners[0].id  # type: ignore[union-attr]  # a JobRow

    active = await store.list_jobs(
        statuses=[JobStatus.QUEUED, JobStatus.RUNNING], limit=10 * RACE_ROUNDS
    )
    unforced = [row for row in active if not row.forced]
    assert len(unforced) == RACE_ROUNDS
    assert len({row.request_key for row in unforced}) == RACE_ROUNDS


async def test_complete_racing_a_cancel_ends_cancelled_whenever_the_cancel_landed_first(
    store: JobStore, second_store: JobStore
) -> None:
    for round_no in range(RACE_ROUNDS):
        job = await running(store, new_job())
        result: dict[str, object] = {}

        async def finish() -> None:
            result["applied"] = await store.complete(job.id, OWNER, done(output=f"r{round_no}"))

        async def cancel() -> None:
            result["seen"] = await second_store.request_cancel(job.id)

        await race(round_no, finish, cancel)

        assert result["applied"] is not None  # the row was active whichever came first
        seen = result["seen"]
        assert isinstance(seen, JobRow)
        final = await get(store, job.id)
        if seen.status.is_active:  # the cancel landed while the job was still running
            assert seen.cancel_requested_at is not None
            assert final.status is JobStatus.CANCELLED
        else:  # the completion landed first; the cancel found a terminal row
            assert (seen.status, seen.cancel_requested_at) == (JobStatus.COMPLETED, None)
            assert final.status is JobStatus.COMPLETED
        assert final.output == f"r{round_no}"

        # Terminal: nothing that arrives later flips it.
        assert not await second_store.complete(job.id, OWNER, done(JobStatus.FAILED))
        again = await second_store.request_cancel(job.id)
        assert again is not None
        assert (again.status, again.cancel_requested_at) == (
            final.status, final.cancel_requested_at,
        )
        assert await get(store, job.id) == final


async def test_two_racing_reapers_flip_each_expired_job_exactly_once(
    store: JobStore, second_store: JobStore
) -> None:
    for _ in range(RACE_ROUNDS // 10):
        expired = [await running(store, new_job(), ttl_s=EXPIRED_TTL_S) for _ in range(10)]
        results: list[list[JobRow]] = []

        async def sweep(target: JobStore) -> None:
            results.append(await reap(target, HTTP_GRACE_S))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sweep, store)
            tg.start_soon(sweep, second_store)

        ids = [row.id for rows in results for row in rows]
        assert sorted(ids) == sorted(job.id for job in expired)  # each once, none twice


async def test_mark_running_racing_the_reaper_has_exactly_one_winner(
    store: JobStore, second_store: JobStore
) -> None:
    for _ in range(RACE_ROUNDS // 2):
        job = new_job()
        await store.insert_job(job, EXPIRED_TTL_S)
        result: dict[str, object] = {}

        async def launch() -> None:
            result["started"] = await store.mark_running(job.id, OWNER, TTL_S)

        async def sweep() -> None:
            result["flipped"] = await reap(second_store, HTTP_GRACE_S)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sweep)
            tg.start_soon(launch)

        flipped = job.id in {row.id for row in result["flipped"]}  # type: ignore[attr-defined]
        assert result["started"] is not flipped
        status = (await get(store, job.id)).status
        assert status is (JobStatus.ORPHANED if flipped else JobStatus.RUNNING)


# -- detach, adoption, re-queue (docs/architecture.md) ---------------------------------------

ADOPTERS = 4  # gateways adopting one job at once in the race below
ORPHANED_WITHIN_S = 3600.0


def take(job: JobRow | NewJob, expected_owner: str | None, status: JobStatus,
         by: str = OTHER, boot_id: str = "boot-1") -> TakeOver:
    return TakeOver(job_id=job.id, expected_owner=expected_owner, expected_status=status,
                    instance_id=by, hostname="host-1", boot_id=boot_id, ttl_s=TTL_S)


async def candidates(store: JobStore, by: str = OTHER, boot_id: str = "boot-1") -> set[str]:
    found = await store.list_adoption_candidates(by, "host-1", boot_id, ORPHANED_WITHIN_S, 100)
    for candidate in found:
        assert candidate.job.output is None and candidate.job.result_json is None
    return {c.job.id for c in found}


async def test_extend_leases_pushes_only_this_instances_running_jobs_and_never_back(
    store: JobStore,
) -> None:
    mine = await running(store, new_job())
    queued = new_job()
    await store.insert_job(queued, TTL_S)
    theirs = await running(store, new_job(owner=OTHER))
    before = epoch(mine.lease_deadline)
    extended = await store.extend_leases(OWNER, {mine.id: 600.0, queued.id: 600.0,
                                                 theirs.id: 600.0})
    assert extended == 1
    assert epoch((await get(store, mine.id)).lease_deadline) >= before + 500
    assert epoch((await get(store, theirs.id)).lease_deadline) < before + 500
    assert await store.extend_leases(OWNER, {mine.id: 1.0}) == 1
    assert epoch((await get(store, mine.id)).lease_deadline) >= before + 500  # not shortened
    assert await store.extend_leases(OWNER, {}) == 0


async def test_adoption_candidates_are_jobs_of_gone_or_local_owners_on_this_host(
    store: JobStore,
) -> None:
    await store.register_instance(instance("stopped"), TTL_S)
    await store.mark_instance_stopped("stopped")
    await store.register_instance(instance("local"), TTL_S)
    await store.register_instance(instance("remote", hostname="host-2"), TTL_S)
    of_stopped = await running(store, new_job(owner="stopped"))
    of_collected = await running(store, new_job(owner="collected"))
    of_local = new_job(owner="local")
    await store.insert_job(of_local, TTL_S)
    of_remote = await running(store, new_job(owner="remote"))
    own = await running(store, new_job(owner=OTHER))
    elsewhere = new_job(owner="stopped")
    elsewhere.hostname = "host-2"
    await store.insert_job(elsewhere, TTL_S)
    draining_http = await running(store, new_job(owner="stopped", transport="http"))
    found = await candidates(store)
    assert {of_stopped.id, of_collected.id, of_local.id} <= found
    assert not {of_remote.id, own.id, elsewhere.id, draining_http.id} & found
    owners = {c.job.id: c.owner for c in await store.list_adoption_candidates(
        OTHER, "host-1", "boot-1", ORPHANED_WITHIN_S, 100)}
    assert owners[of_collected.id] is None
    stopped_owner = owners[of_stopped.id]
    assert stopped_owner is not None and stopped_owner.stopped_at is not None
    assert owners[of_local.id] is not None and owners[of_local.id].pid == 4242  # type: ignore[union-attr]


async def test_adoption_candidates_of_lapsed_owners_come_before_older_ones_of_live_owners(
    store: JobStore,
) -> None:
    # A busy host's live jobs must not fill a sweep's batch ahead of a dead owner's: the
    # reaper would orphan that one unseen (base.JobStore.list_adoption_candidates).
    await store.register_instance(instance("live"), TTL_S)
    await store.register_instance(instance("lapsed"), EXPIRED_TTL_S)
    await store.register_instance(instance("stopped"), TTL_S)
    await store.mark_instance_stopped("stopped")
    live = [new_job(owner="live") for _ in range(3)]
    for job in live:
        await store.insert_job(job, TTL_S)
    gone = [new_job(owner=owner) for owner in ("lapsed", "stopped", "collected")]
    for job in gone:
        await store.insert_job(job, TTL_S)
    found = await store.list_adoption_candidates(OTHER, "host-1", "boot-1",
                                                 ORPHANED_WITHIN_S, 4)
    order = [c.job.id for c in found]
    assert set(order[:3]) == {job.id for job in gone}
    assert order[3] == live[0].id  # then the oldest


async def test_orphaned_jobs_are_never_adoption_candidates(store: JobStore) -> None:
    # `orphaned` is final: no adopter heals or re-queues it (a poller that read it stopped).
    started = await orphaned(store, new_job(owner="gone"))
    unstarted = await orphaned(store, new_job(owner="gone"), run=False)
    assert not {started.id, unstarted.id} & await candidates(store)
    assert not {started.id, unstarted.id} & await candidates(store, boot_id="boot-2")


async def test_an_orphaning_on_the_jobs_own_host_is_final(store: JobStore) -> None:
    job = new_job()
    await store.insert_job(job, EXPIRED_TTL_S)
    assert await store.mark_running(job.id, OWNER, EXPIRED_TTL_S)
    flipped = await reap(store, HTTP_GRACE_S, orphaned_by="host-1")
    assert job.id in {r.id for r in flipped}
    assert (await get(store, job.id)).orphaned_by == "host-1"
    # The stale owner revives with the real answer: the terminal state it would change was
    # already read by a poller as final.
    assert not await store.complete(job.id, OWNER, done())
    assert (await get(store, job.id)).status is JobStatus.ORPHANED


async def test_an_orphaning_from_another_host_may_be_self_healed_by_its_owner(
    store: JobStore,
) -> None:
    job = new_job()
    await store.insert_job(job, EXPIRED_TTL_S)
    assert await store.mark_running(job.id, OWNER, EXPIRED_TTL_S)
    await reap(store, HTTP_GRACE_S, orphaned_by="host-2")
    assert await store.complete(job.id, OWNER, done())
    assert (await get(store, job.id)).status is JobStatus.COMPLETED


async def test_adopt_job_is_one_compare_and_set_on_the_owner(store: JobStore) -> None:
    job = await running(store, new_job(owner="gone"))
    assert await store.adopt_job(take(job, "someone-else", JobStatus.RUNNING)) is None
    assert await store.adopt_job(take(job, "gone", JobStatus.QUEUED)) is None
    assert await store.adopt_job(take(job, "gone", JobStatus.RUNNING, boot_id="boot-2")) is None
    adopted = await store.adopt_job(take(job, "gone", JobStatus.RUNNING))
    assert adopted is not None and adopted.owner_instance == OTHER
    assert adopted.status is JobStatus.RUNNING and adopted.pid == job.pid
    assert await store.adopt_job(take(job, "gone", JobStatus.RUNNING, by="third")) is None
    # The adopter finalizes it as its own (and a heartbeat of the old owner changes nothing).
    assert await store.complete(job.id, OTHER, done())
    assert (await get(store, job.id)).status is JobStatus.COMPLETED


async def test_an_adopted_orphaned_job_is_healed_by_its_adopter(store: JobStore) -> None:
    job = await orphaned(store, new_job(owner="gone"))
    adopted = await store.adopt_job(take(job, "gone", JobStatus.ORPHANED))
    assert adopted is not None and adopted.status is JobStatus.ORPHANED
    assert adopted.lease_deadline is None
    assert await store.complete(job.id, OTHER, done())
    assert (await get(store, job.id)).status is JobStatus.COMPLETED


async def test_requeue_job_queues_unstarted_work_again_each_time_an_owner_left_it(
    store: JobStore,
) -> None:
    job = await orphaned(store, new_job(owner="gone"))
    requeued = await store.requeue_job(take(job, "gone", JobStatus.ORPHANED))
    assert requeued is not None
    assert (requeued.status, requeued.owner_instance) == (JobStatus.QUEUED, OTHER)
    assert requeued.requeued_at is not None and requeued.started_at is None
    assert (requeued.pid, requeued.error_kind, requeued.finished_at) == (None, None, None)
    # Its second owner leaves it unstarted too (the caller proved it from the spool): it is
    # queued again, once more one winner. The spool, not a count, keeps it to one launch.
    assert await store.mark_running(job.id, OTHER, TTL_S)
    again = await store.requeue_job(take(job, OTHER, JobStatus.RUNNING, by="third"))
    assert again is not None and again.owner_instance == "third"
    assert await store.requeue_job(take(job, OTHER, JobStatus.RUNNING, by="fourth")) is None
    # Orphaned while queued a second time: still a candidate, still re-queued.
    assert job.id in await candidates(store, by="fifth")


async def test_a_stale_owner_cannot_end_a_job_that_changed_hands(store: JobStore) -> None:
    adopted = await running(store, new_job(owner="stale"))
    assert await store.adopt_job(take(adopted, "stale", JobStatus.RUNNING)) is not None
    assert not await store.complete(adopted.id, "stale", done(output="what it saw"))
    requeued = new_job(owner="stale")
    await store.insert_job(requeued, TTL_S)
    assert await store.requeue_job(take(requeued, "stale", JobStatus.QUEUED)) is not None
    assert not await store.complete(requeued.id, "stale", done(output="not this run"))
    for job in (adopted, requeued):
        assert (await get(store, job.id)).status.is_active
        assert await store.complete(job.id, OTHER, done())  # its new owner ends it


async def test_requeue_job_retries_an_api_call_that_started_only_once(store: JobStore) -> None:
    job = new_job(owner="gone", transport="http")
    await store.insert_job(job, TTL_S)
    assert await store.mark_running(job.id, "gone", TTL_S)
    assert await store.requeue_job(take(job, "gone", JobStatus.RUNNING)) is not None
    # Its second owner left it queued: it never reached the API again, so it may go on.
    assert await store.requeue_job(take(job, OTHER, JobStatus.QUEUED, by="third")) is not None
    assert await store.mark_running(job.id, "third", TTL_S)
    # Started a second time (it may have been billed twice over): never a third call.
    assert await store.requeue_job(take(job, "third", JobStatus.RUNNING, by="fourth")) is None


async def test_requeue_job_refuses_a_cancelled_job_and_one_with_an_active_twin(
    store: JobStore,
) -> None:
    cancelled = new_job(owner="gone")
    await store.insert_job(cancelled, TTL_S)
    await store.request_cancel(cancelled.id)
    assert await store.requeue_job(take(cancelled, "gone", JobStatus.QUEUED)) is None
    first = await orphaned(store, new_job(owner="gone", key="twin-key"), run=False)
    await store.insert_job(new_job(key="twin-key"), TTL_S)  # a new identical request runs
    assert await store.requeue_job(take(first, "gone", JobStatus.ORPHANED)) is None


async def test_racing_adopters_have_exactly_one_winner(
    store: JobStore, store_factory: Callable[[], Awaitable[JobStore]]
) -> None:
    adopters = [store, *[await store_factory() for _ in range(ADOPTERS - 1)]]
    for _ in range(RACE_ROUNDS // 10):
        job = await running(store, new_job(owner="gone"))
        unstarted = new_job(owner="gone")
        await store.insert_job(unstarted, TTL_S)
        won: list[str] = []
        requeued: list[str] = []

        async def adopt(target: JobStore, name: str) -> None:
            if await target.adopt_job(take(job, "gone", JobStatus.RUNNING, by=name)):
                won.append(name)
            if name == "adopter-0":  # one of them adopts the unstarted job...
                if await target.adopt_job(take(unstarted, "gone", JobStatus.QUEUED, by=name)):
                    requeued.append("adopted")
            elif await target.requeue_job(take(unstarted, "gone", JobStatus.QUEUED, by=name)):
                requeued.append(name)  # ... while the others re-queue it

        async with anyio.create_task_group() as tg:
            for n, target in enumerate(adopters):
                tg.start_soon(adopt, target, f"adopter-{n}")
        assert len(won) == 1
        assert (await get(store, job.id)).owner_instance == won[0]
        assert len(requeued) == 1


async def test_complete_racing_the_reaper_never_loses_the_result(
    store: JobStore, second_store: JobStore
) -> None:
    """The owner's terminal write and a sweep of its lapsed job, raced: whichever locks the
    row first (PostgreSQL's reaper skips a row a completion holds), the result is stored,
    and the reaper flips the row at most once (an orphaned row self-heals for its owner)."""
    for round_no in range(RACE_ROUNDS // 2):
        job = await running(store, new_job(), ttl_s=EXPIRED_TTL_S)
        result: dict[str, object] = {}

        async def finish() -> None:
            result["applied"] = await store.complete(job.id, OWNER, done(output=f"r{round_no}"))

        async def sweep() -> None:
            result["flipped"] = await reap(second_store, HTTP_GRACE_S)

        await race(round_no, finish, sweep)

        assert result["applied"] is not None
        assert [r.id for r in result["flipped"]] in ([], [job.id])  # type: ignore[attr-defined]
        final = await get(store, job.id)
        assert (final.status, final.output) == (JobStatus.COMPLETED, f"r{round_no}")


async def test_read_output_past_any_integer_column_is_an_empty_page(store: JobStore) -> None:
    # An offset or length of 2**62 (a caller's bad page) must not overflow a 32-bit SQL
    # argument (PostgreSQL's substring) or allocate: past the end is just an empty page.
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output="short", output_bytes=5))
    for offset, length in ((2**62, 10), (0, 2**62), (2**62, 2**62), (2**31, 2**31)):
        data, total = await store.read_output(job.id, offset, length) or (None, None)
        assert total == 5
        assert data == (b"short" if offset == 0 else b"")
