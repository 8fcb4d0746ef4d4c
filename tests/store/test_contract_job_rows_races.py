"""The JobRows role on every backend, raced between two real connections to the same storage
(`second_store`): each invariant has exactly one winner whatever the interleaving.
"""

from __future__ import annotations

import anyio
import pytest

from gateway.model import (
    JobRow,
    JobStatus,
    NewJob,
)
from gateway.store.base import DuplicateActiveJob, JobStore
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    HTTP_GRACE_S,
    OTHER,
    OWNER,
    RACE_HEARTBEAT_EVERY_S,
    RACE_LIMIT_S,
    RACE_RECOVER_EVERY_S,
    RACE_ROUNDS,
    RACE_TTL_S,
    TTL_S,
    done,
    epoch,
    get,
    instance,
    new_job,
    race,
    reap,
    running,
)
from tests.waiting import scaled

pytestmark = pytest.mark.anyio


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

    with anyio.fail_after(scaled(RACE_LIMIT_S)):
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
