"""The JobRows role on every backend: the reaper's reads and flips of jobs whose lease passed.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gateway.model import (
    JobStatus,
    Progress,
)
from gateway.store.base import JobStore
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    HTTP_GRACE_S,
    OWNER,
    TTL_S,
    WINDOW_S,
    done,
    epoch,
    get,
    new_job,
    reap,
    running,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio


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
