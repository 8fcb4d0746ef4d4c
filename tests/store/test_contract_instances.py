"""The InstanceRows role on every backend: registration, the heartbeat that is every owned
job's lease, a clean stop, the collection of rows whose owner is gone.
"""

from __future__ import annotations

import pytest

from gateway.model import (
    JobStatus,
)
from gateway.store.base import JobStore
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    OTHER,
    OWNER,
    PAST_S,
    TTL_S,
    WINDOW_S,
    epoch,
    get,
    instance,
    new_job,
    orphaned,
    reap,
    running,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio


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
