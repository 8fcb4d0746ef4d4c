"""The JobRows role on every backend: detach, adoption and re-queue (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.model import (
    JobRow,
    JobStatus,
    NewJob,
)
from gateway.store.base import JobStore, TakeOver
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    HTTP_GRACE_S,
    OTHER,
    OWNER,
    RACE_ROUNDS,
    TTL_S,
    done,
    epoch,
    get,
    instance,
    new_job,
    orphaned,
    reap,
    running,
)

pytestmark = pytest.mark.anyio


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
    assert (await get(store, job.id)).adopted_at is None  # a losing CAS stamps nothing
    adopted = await store.adopt_job(take(job, "gone", JobStatus.RUNNING))
    assert adopted is not None and adopted.owner_instance == OTHER
    assert adopted.status is JobStatus.RUNNING and adopted.pid == job.pid
    assert adopted.adopted_at is not None and job.started_at is not None
    assert adopted.adopted_at >= job.started_at
    assert (await get(store, job.id)).adopted_at == adopted.adopted_at
    assert await store.adopt_job(take(job, "gone", JobStatus.RUNNING, by="third")) is None
    assert (await get(store, job.id)).adopted_at == adopted.adopted_at
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
    assert requeued is not None and requeued.adopted_at is None  # a re-queue is no adoption
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
