"""The completion-notice outbox (issue 40) on every backend and through PgBouncer: the
terminal write adds its notice in its transaction (whoever ends the job: its owner, the
reaper), once; delivery is claimed by exactly one deliverer, settled only by the claim's
holder, retried when due, and a lapsed claim is taken over."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.model import JobStatus, UsageFigures
from gateway.store.base import JobStore
from gateway.store.outbox import Notice
from tests.store.contract_helpers import (
    OWNER,
    done,
    new_job,
    orphaned,
    running,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio

LEASE_S = 60.0
MANY = 1000  # a claim limit that takes every due notice (the store may hold other tests')


async def mine(store: JobStore, job_ids: set[str]) -> list[Notice]:
    return [n for n in await store.list_notices(limit=MANY) if n.job_id in job_ids]


async def claim_mine(store: JobStore, who: str, job_ids: set[str],
                     lease_s: float = LEASE_S) -> list[Notice]:
    return [n for n in await store.claim_notices(who, lease_s, MANY) if n.job_id in job_ids]


async def test_a_completion_adds_one_notice_with_its_outcome_and_cost(store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    figures = UsageFigures(cost_source="reported", cost_usd=0.25)
    assert await store.complete(job.id, OWNER, done(usage=figures))
    assert await store.complete(job.id, OWNER, done()) is None  # terminal: no second write
    (notice,) = await mine(store, {job.id})
    assert notice.id == f"{job.id}:completed"
    assert (notice.job_id, notice.provider, notice.status) == (job.id, "claude", "completed")
    assert notice.cost_usd == pytest.approx(0.25)
    assert notice.duration_s is not None and notice.duration_s >= 0
    assert notice.attempts == 0 and notice.delivered_at is None and notice.sinks_done == []
    payload = notice.payload()
    assert payload["id"] == notice.id and payload["read_with"].endswith(job.id)
    assert "completed" in payload["summary"]


async def test_a_failure_and_a_reaper_orphaning_add_their_notices(store: JobStore) -> None:
    failed, lost = new_job(), new_job()
    await running(store, failed)
    assert await store.complete(failed.id, OWNER, done(
        JobStatus.FAILED, error="boom\nmore", error_kind="provider_error"))
    await orphaned(store, lost)
    notices = {n.job_id: n for n in await mine(store, {failed.id, lost.id})}
    assert notices[failed.id].status == "failed"
    assert notices[failed.id].payload()["error"] == "boom"
    assert "provider_error: boom" in notices[failed.id].summary()
    assert notices[lost.id].status == "orphaned" and notices[lost.id].error_kind == "orphaned"


async def test_an_active_job_has_no_notice(store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    assert await mine(store, {job.id}) == []
    assert await claim_mine(store, "d1", {job.id}) == []


async def test_a_claim_is_held_until_settled_and_only_its_holder_settles(
        store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    await store.complete(job.id, OWNER, done())
    (claimed,) = await claim_mine(store, "d1", {job.id})
    assert claimed.claimed_by == "d1" and claimed.attempts == 1
    assert await claim_mine(store, "d2", {job.id}) == []  # held
    assert not await store.settle_notice(claimed.id, "d2", "delivered")
    assert not await store.record_notice_sink(claimed.id, "d2", "webhook")
    assert await store.record_notice_sink(claimed.id, "d1", "webhook")
    assert await store.record_notice_sink(claimed.id, "d1", "webhook")  # idempotent
    assert await store.settle_notice(claimed.id, "d1", "delivered")
    assert not await store.settle_notice(claimed.id, "d1", "delivered")  # once
    (notice,) = await mine(store, {job.id})
    assert notice.delivered_at is not None and notice.outcome == "delivered"
    assert notice.sinks_done == ["webhook"]
    assert await claim_mine(store, "d2", {job.id}) == []  # delivered: never again


async def test_a_retry_is_due_again_after_its_wait_and_keeps_the_sinks_done(
        store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    await store.complete(job.id, OWNER, done())
    (first,) = await claim_mine(store, "d1", {job.id})
    await store.record_notice_sink(first.id, "d1", "command")
    assert await store.settle_notice(first.id, "d1", "retry", retry_in_s=0.3, error="HTTP 500")
    assert await claim_mine(store, "d2", {job.id}) == []  # not due yet
    released_at = await store.now()
    await wait_for_store_time(store, released_at + 0.3)
    with anyio.fail_after(10):
        while not (again := await claim_mine(store, "d2", {job.id})):
            await anyio.sleep(0.02)
    (second,) = again
    assert second.attempts == 2 and second.sinks_done == ["command"]
    assert second.last_error == "HTTP 500"
    assert await store.settle_notice(second.id, "d2", "failed", error="HTTP 500")
    assert await store.count_failed_notices() >= 1
    failed = [n for n in await store.list_notices(failed_only=True, limit=MANY)
              if n.job_id == job.id]
    assert failed and failed[0].failed_at is not None and failed[0].outcome == "failed"


async def test_a_lapsed_claim_is_taken_over_and_the_old_holder_can_no_longer_settle(
        store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    await store.complete(job.id, OWNER, done())
    (first,) = await claim_mine(store, "dead", {job.id}, lease_s=0.2)
    claimed_at = await store.now()
    await wait_for_store_time(store, claimed_at + 0.2)
    with anyio.fail_after(10):
        while not (taken := await claim_mine(store, "d2", {job.id})):
            await anyio.sleep(0.02)
    assert taken[0].attempts == 2 and taken[0].claimed_by == "d2"
    assert not await store.settle_notice(first.id, "dead", "delivered")
    assert await store.settle_notice(first.id, "d2", "skipped")


async def test_retention_takes_a_jobs_notices_with_it(store: JobStore) -> None:
    job = new_job()
    await running(store, job)
    await store.complete(job.id, OWNER, done())
    ended = await store.now()
    await wait_for_store_time(store, ended + 0.2)
    purged: list[str] = []
    while batch := await store.purge_terminal(0.1):
        purged.extend(batch)
    assert job.id in purged
    assert await mine(store, {job.id}) == []


async def test_of_many_racing_deliverers_on_several_connections_each_notice_is_claimed_once(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(4)]
    ids: set[str] = set()
    for _ in range(12):
        job = new_job()
        await running(stores[0], job)
        await stores[0].complete(job.id, OWNER, done())
        ids.add(job.id)
    claims: list[tuple[str, str]] = []

    async def deliverer(n: int) -> None:
        who = f"d{n}"
        for _ in range(5):
            for notice in await claim_mine(stores[n % len(stores)], who, ids):
                claims.append((notice.id, who))

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(deliverer, n)
    claimed_ids = [notice_id for notice_id, _ in claims]
    assert sorted(claimed_ids) == sorted(f"{i}:completed" for i in ids)  # each exactly once
