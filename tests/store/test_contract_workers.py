"""The WorkerQueue role (issue 42): capabilities on the instance row, the claim of a queued
remote job by a worker, and the owner's sweeps. On PostgreSQL a remote job is claimed once
whoever races; on SQLite and memory (one host) no remote job exists and nothing is claimed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.model import JobStatus, NewJob
from gateway.store.base import JobStore, TakeOver
from gateway.store.protocol_roles import RemotePatch, WorkerClaim
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    OWNER,
    TTL_S,
    get,
    instance,
    new_job,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio

CLAIMERS = 6  # workers racing for one batch of jobs, each on its own connection
RACED_JOBS = 60


def worker(name: str, *, providers: tuple[str, ...] = ("claude",),
           labels: dict[str, str] | None = None,
           principals: tuple[str, ...] | None = None) -> WorkerClaim:
    return WorkerClaim(instance_id=name, hostname=f"{name}-host", boot_id=f"{name}-boot",
                       ttl_s=TTL_S, providers=providers, labels=labels or {},
                       principals=principals)


def remote(runs_on: object, **changes: object) -> NewJob:
    return dataclasses.replace(new_job(**changes),  # type: ignore[arg-type]
                               runs_on=json.dumps(runs_on))


async def test_capabilities_are_published_on_the_instance_row(store: JobStore) -> None:
    await store.register_instance(instance(OWNER), TTL_S)
    caps = json.dumps({"providers": {"codex": {"logged_in": "yes"}}, "labels": {"gpu": "1"}})
    assert await store.publish_capabilities(OWNER, caps)
    assert not await store.publish_capabilities("no-such-instance", caps)
    [row] = await store.list_instances()
    assert row.capabilities == caps
    await store.heartbeat(OWNER, TTL_S)
    await store.register_instance(instance(OWNER), TTL_S)  # none given: the row keeps its own
    [row] = await store.list_instances()
    assert row.capabilities == caps


async def test_one_host_stores_claim_nothing_and_sweep_nothing(store: JobStore) -> None:
    if store.backend == "postgres":
        pytest.skip("PostgreSQL claims: see the tests below")
    job = new_job()
    await store.insert_job(job, TTL_S)
    assert await store.claim_jobs(worker("w1"), 10) == []
    assert await store.set_unschedulable(OWNER, {job.id: "nobody"}) == 0
    assert await store.fail_unscheduled(OWNER, 0.0, "no worker") == []
    assert not await store.record_worktree_plan(job.id, OWNER, "{}")
    assert (await get(store, job.id)).status is JobStatus.QUEUED


@pytest.fixture
def postgres_only(store: JobStore) -> JobStore:
    if store.backend != "postgres":
        pytest.skip("remote jobs exist on PostgreSQL only")
    return store


async def test_a_worker_claims_only_the_remote_jobs_it_meets(postgres_only: JobStore) -> None:
    store = postgres_only
    here = new_job()
    anywhere = remote("any")
    gpu = remote({"labels": {"gpu": "true"}})
    buildbox = remote({"host": "w1-host"})
    other_box = remote({"host": "elsewhere"})
    codex = remote("any", provider="codex")
    for job in (here, anywhere, gpu, buildbox, other_box, codex):
        await store.insert_job(job, TTL_S)
    claimed = await store.claim_jobs(worker("w1", labels={"gpu": "true", "os": "linux"}), 10)
    assert {row.id for row in claimed} == {anywhere.id, gpu.id, buildbox.id}
    for row in claimed:
        assert row.owner_instance == "w1" and row.hostname == "w1-host"
        assert row.boot_id == "w1-boot" and row.claimed_at is not None
        assert row.status is JobStatus.QUEUED and row.output is None
    # Claimed once: nothing is left for a second worker that meets them too.
    assert await store.claim_jobs(worker("w2", labels={"gpu": "true"}), 10) == []
    assert (await get(store, here.id)).owner_instance == OWNER
    assert (await get(store, other_box.id)).claimed_at is None
    [row] = await store.claim_jobs(worker("w3", providers=("codex",)), 10)
    assert row.id == codex.id


async def test_a_claim_respects_its_limit_oldest_first_and_the_principals(
    postgres_only: JobStore,
) -> None:
    store = postgres_only
    jobs = [remote("any", principal="alice") for _ in range(3)]
    for job in jobs:
        await store.insert_job(job, TTL_S)
    bob_only = worker("w1", principals=("bob",))
    assert await store.claim_jobs(bob_only, 10) == []
    first = await store.claim_jobs(worker("w1", principals=("alice",)), 2)
    assert [row.id for row in first] == [jobs[0].id, jobs[1].id]
    assert await store.claim_jobs(worker("w2"), 0) == []


async def test_a_job_with_a_cancel_request_is_never_claimed(postgres_only: JobStore) -> None:
    store = postgres_only
    job = remote("any")
    await store.insert_job(job, TTL_S)
    await store.request_cancel(job.id)
    assert await store.claim_jobs(worker("w1"), 10) == []


async def test_the_claimer_owns_the_job_and_runs_it_through_the_usual_cas(
    postgres_only: JobStore,
) -> None:
    store = postgres_only
    job = remote("any")
    await store.insert_job(job, TTL_S)
    [row] = await store.claim_jobs(worker("w1"), 1)
    assert not await store.mark_running(job.id, OWNER, TTL_S)  # the admitter no longer owns it
    assert await store.mark_running(row.id, "w1", TTL_S)
    assert (await get(store, job.id)).status is JobStatus.RUNNING


async def test_the_owner_marks_and_fails_what_nobody_can_take(postgres_only: JobStore) -> None:
    store = postgres_only
    stuck = remote({"labels": {"gpu": "true"}})
    taken = remote("any")
    for job in (stuck, taken):
        await store.insert_job(job, TTL_S)
    changed = await store.set_unschedulable(OWNER, {stuck.id: "no live worker has gpu=true",
                                                    taken.id: None})
    assert changed == 1  # taken's reason was already NULL
    assert (await get(store, stuck.id)).unschedulable_reason == "no live worker has gpu=true"
    assert await store.set_unschedulable("someone-else", {stuck.id: "x"}) == 0
    await store.claim_jobs(worker("w1"), 10)  # takes `taken` only
    admitted = (await get(store, stuck.id)).created_at
    assert admitted is not None
    assert await store.fail_unscheduled(OWNER, 60.0, "no worker") == []  # not waited enough
    await wait_for_store_time(store, admitted.timestamp() + 0.3)
    assert await store.fail_unscheduled(OWNER, 0.2, "Submit it again.") == [stuck.id]
    row = await get(store, stuck.id)
    assert row.status is JobStatus.FAILED and row.error_kind == "no_worker"
    assert row.error == "no live worker has gpu=true. Submit it again."
    assert row.finished_at is not None
    assert (await get(store, taken.id)).status is JobStatus.QUEUED  # claimed: never failed


async def test_a_requeued_remote_job_goes_back_to_the_pool(postgres_only: JobStore) -> None:
    store = postgres_only
    job = remote("any")
    await store.insert_job(job, TTL_S)
    [row] = await store.claim_jobs(worker("w1"), 1)
    again = await store.requeue_job(TakeOver(
        job_id=row.id, expected_owner="w1", expected_status=JobStatus.QUEUED,
        instance_id="w1-restarted", hostname="w1-host", boot_id="w1-boot", ttl_s=TTL_S))
    assert again is not None and again.claimed_at is None
    [second] = await store.claim_jobs(worker("w2"), 1)
    assert second.id == job.id and second.owner_instance == "w2"


async def test_only_the_claimer_records_a_worktree_plan_and_only_before_the_run(
        postgres_only: JobStore) -> None:
    store = postgres_only
    job = remote("any")
    await store.insert_job(job, TTL_S)
    planned = json.dumps({"prompt": "p", "worktree": {"path": "/w/1"}})
    assert not await store.record_worktree_plan(job.id, "w1", planned)  # not claimed yet
    [row] = await store.claim_jobs(worker("w1"), 1)
    assert not await store.record_worktree_plan(row.id, "w2", planned)  # not its claimer
    assert not await store.record_worktree_plan(row.id, OWNER, planned)  # nor the admitter
    assert await store.record_worktree_plan(row.id, "w1", planned)
    assert (await get(store, job.id)).request_json == planned
    assert await store.mark_running(row.id, "w1", TTL_S)
    assert not await store.record_worktree_plan(row.id, "w1", "{}")  # the run has started
    assert (await get(store, job.id)).request_json == planned


async def test_a_plan_racing_a_return_to_the_pool_lands_only_if_it_came_first(
    postgres_only: JobStore, store_factory: Callable[[], Awaitable[JobStore]],
) -> None:
    """A claimer that writes its plan while the reaper hands the lapsed job back to the
    pool: the plan lands only if it came first (then the pool takes the row with it, and
    the next claimer writes its own); once the row went back, the claimer's write fails."""
    store = postgres_only
    for _ in range(10):
        job = remote("any", owner="gone-instance")
        await store.insert_job(job, EXPIRED_TTL_S)
        claim = dataclasses.replace(worker("w9"), ttl_s=EXPIRED_TTL_S)
        [row] = await store.claim_jobs(claim, 1)
        other = await store_factory()
        planned = json.dumps({"prompt": "p", "worktree": {"path": f"/w/{job.id}"}})
        outcome: dict[str, object] = {}

        async def plan(writer: JobStore = other, job_id: str = row.id,
                       text: str = planned) -> None:
            outcome["plan"] = await writer.record_worktree_plan(job_id, "w9", text)

        taker = instance("reaper-host-gateway", hostname="host-2")

        async def pool(job_id: str = row.id) -> None:
            outcome["pool"] = await store.return_to_pool(taker, TTL_S, 0.0, [job_id])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(plan)
                group.start_soon(pool)
        if outcome["pool"] == []:  # SKIP LOCKED past the plan's write: the next sweep
            assert outcome["plan"] is True
            assert await store.return_to_pool(taker, TTL_S, 0.0, [row.id]) == [row.id]
        after = await get(store, row.id)
        assert after.claimed_at is None and after.owner_instance == "reaper-host-gateway"
        assert outcome["plan"] == (after.request_json == planned), outcome
        assert not await other.record_worktree_plan(row.id, "w9", planned)  # not its now


async def test_racing_workers_claim_each_job_exactly_once(
    postgres_only: JobStore, store_factory: Callable[[], Awaitable[JobStore]],
) -> None:
    """N workers on N connections claim one batch at once, in small bites, until nothing is
    left: every job is claimed, none twice, while a cancel and the owner's no_worker sweep
    race them on a few (whoever commits first wins; a job is never both)."""
    store = postgres_only
    jobs = [remote("any") for _ in range(RACED_JOBS)]
    for job in jobs:
        await store.insert_job(job, TTL_S)
    stores = [await store_factory() for _ in range(CLAIMERS)]
    claims: dict[str, list[str]] = {}
    cancelled: list[str] = []

    async def claimer(index: int) -> None:
        me = worker(f"w{index}")
        while True:
            rows = await stores[index].claim_jobs(me, 3)
            if not rows:
                return
            for row in rows:
                claims.setdefault(row.id, []).append(me.instance_id)
            await anyio.sleep(0)

    async def canceller() -> None:
        for job in jobs[::10]:
            after = await store.request_cancel(job.id)
            if after is not None and after.claimed_at is None:
                cancelled.append(job.id)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for index in range(CLAIMERS):
                group.start_soon(claimer, index)
            group.start_soon(canceller)
    assert all(len(owners) == 1 for owners in claims.values()), claims
    assert set(claims) | set(cancelled) == {job.id for job in jobs}
    assert not set(claims) & set(cancelled)
    for job_id, [owner] in claims.items():
        assert (await get(store, job_id)).owner_instance == owner


async def test_a_lapsed_unstarted_remote_job_goes_back_to_the_pool_not_to_orphaned(
        postgres_only: JobStore) -> None:
    store = postgres_only
    lapsed = remote("any", owner="gone-instance")  # no instance row: its owner holds no lease
    fresh = remote("any")
    await store.insert_job(lapsed, EXPIRED_TTL_S)
    await store.insert_job(fresh, TTL_S)
    claimed = remote("any", owner="gone-instance")
    await store.insert_job(claimed, TTL_S)
    [row] = await store.claim_jobs(worker("w9"), 1)  # the oldest: `lapsed`
    assert row.id == lapsed.id
    # Claimed by a worker that died at once: its lease lapses with no instance row.
    await store.requeue_job(TakeOver(
        job_id=lapsed.id, expected_owner="w9", expected_status=JobStatus.QUEUED,
        instance_id="w9-gone", hostname="w9-host", boot_id="w9-boot", ttl_s=EXPIRED_TTL_S))
    taker = instance("reaper-host-gateway", hostname="host-2")
    taken = await store.return_to_pool(taker, TTL_S, 0.0, [lapsed.id, fresh.id])
    assert taken == [lapsed.id]  # `fresh` holds its lease: not touched
    row = await get(store, lapsed.id)
    assert row.status is JobStatus.QUEUED and row.claimed_at is None
    assert row.owner_instance == "reaper-host-gateway" and row.hostname == "host-2"
    assert row.requeue_count == 2
    [again] = await store.claim_jobs(worker("w1"), 1)
    assert again.id == lapsed.id


async def test_a_worktree_job_goes_only_to_a_worker_holding_its_repo(
        postgres_only: JobStore) -> None:
    store = postgres_only
    job = remote({"repo": "git@example.org:team/api.git"})
    await store.insert_job(job, TTL_S)
    assert await store.claim_jobs(worker("w1"), 10) == []
    holder = dataclasses.replace(worker("w2"), repos=("api", "git@example.org:team/api.git"))
    [row] = await store.claim_jobs(holder, 10)
    assert row.id == job.id and row.owner_instance == "w2"


def remote_patch(job_id: str, data: bytes | None = b"\x00binary\xff") -> RemotePatch:
    return RemotePatch(job_id=job_id, hostname="w1-host", base_sha="a" * 40, tip="b" * 40,
                       size=9, patch=data)


async def test_a_patch_is_stored_once_and_a_removal_requested_once_whoever_races(
        store: JobStore) -> None:
    if store.backend != "postgres":  # one host: nothing to carry, nothing stored
        assert not await store.put_patch(remote_patch("j1"))
        assert await store.get_patch("j1") is None
        assert not await store.request_worktree_removal("j1")
        assert await store.worktree_removals("w1-host") == []
        return
    assert await store.put_patch(remote_patch("j1"))
    assert not await store.put_patch(remote_patch("j1", b"other"))  # the first one stays
    assert await store.put_patch(remote_patch("j2", None))  # too large: only its size
    got = await store.get_patch("j1")
    assert got is not None and got.patch == b"\x00binary\xff" and not got.discard_requested
    assert (await store.get_patch("j2")).patch is None  # type: ignore[union-attr]
    assert not await store.worktree_removed("j1")  # nothing asked yet: nothing recorded
    results: list[bool] = []

    async def ask() -> None:
        results.append(await store.request_worktree_removal("j1"))

    async with anyio.create_task_group() as group:
        for _ in range(CLAIMERS):
            group.start_soon(ask)
    assert sorted(results) == [False] * (CLAIMERS - 1) + [True]
    assert await store.worktree_removals("w1-host") == ["j1"]
    assert await store.worktree_removals("other-host") == []
    assert await store.worktree_removed("j1")
    assert not await store.worktree_removed("j1")
    assert await store.worktree_removals("w1-host") == []
    assert (await store.get_patch("j1")).discard_requested  # type: ignore[union-attr]
