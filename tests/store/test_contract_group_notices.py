"""An attempt group's notice (issues 39 and 40) on every backend: the move of a group to
`done` adds its notice `group:<id>:done` in the same write, once, naming the winner and
where to read the comparison; a pick or a discard adds none; of racing ends the notice
exists exactly when `done` won; the notice is claimed and settled like a job's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.store.attempts import GroupEnd, GroupStatus
from gateway.store.base import JobStore
from gateway.store.outbox import Notice, group_notice_id
from tests.store.test_contract_attempts import TTL_S, attempt_jobs, group

pytestmark = pytest.mark.anyio

MANY = 1000  # a listing that holds every notice (the store may hold other tests')
RUNNING = (GroupStatus.RUNNING,)
PICKABLE = (GroupStatus.RUNNING, GroupStatus.DONE)


async def notices_of(store: JobStore, group_id: str) -> list[Notice]:
    return [n for n in await store.list_notices(limit=MANY) if n.group_id == group_id]


async def test_a_group_done_adds_one_notice_naming_its_winner(store: JobStore) -> None:
    new = group()
    jobs = attempt_jobs(2)
    await store.insert_attempt_group(new, jobs, TTL_S)
    assert await notices_of(store, new.group_id) == []  # running: nothing to tell
    done = GroupEnd(new.group_id, RUNNING, GroupStatus.DONE, winner_job_id=jobs[1].id,
                    winner_reason="check passed; the only attempt that did")
    assert await store.end_attempt_group(done)
    assert not await store.end_attempt_group(done)  # no longer running: no second notice
    [notice] = await notices_of(store, new.group_id)
    assert notice.id == group_notice_id(new.group_id, "done") == f"group:{new.group_id}:done"
    assert (notice.job_id, notice.provider, notice.status) == (jobs[1].id, "attempts", "done")
    assert notice.duration_s is not None and notice.duration_s >= 0
    payload = notice.payload()
    assert payload["group_id"] == new.group_id and payload["winner_job_id"] == jobs[1].id
    assert payload["read_with"] == f"agent-cli-gateway attempts show {new.group_id}"
    assert payload["summary"] == (f"attempt group {new.group_id[:8]} done after "
                                  f"{round(notice.duration_s)} s: winner {jobs[1].id[:8]} "
                                  "(check passed; the only attempt that did)")
    # The pick that follows is the caller's own act: no notice of its own.
    assert await store.end_attempt_group(GroupEnd(new.group_id, PICKABLE, GroupStatus.PICKED,
                                                  winner_job_id=jobs[0].id))
    assert [n.id for n in await notices_of(store, new.group_id)] == [notice.id]


async def test_a_group_done_without_a_winner_says_so_and_a_discard_adds_nothing(
        store: JobStore) -> None:
    none_won, discarded = group(), group()
    await store.insert_attempt_group(none_won, attempt_jobs(2), TTL_S)
    await store.insert_attempt_group(discarded, attempt_jobs(2), TTL_S)
    assert await store.end_attempt_group(GroupEnd(none_won.group_id, RUNNING, GroupStatus.DONE))
    [notice] = await notices_of(store, none_won.group_id)
    assert notice.job_id == none_won.group_id and notice.payload()["winner_job_id"] is None
    assert notice.summary().endswith(": no winner")
    assert await store.end_attempt_group(GroupEnd(discarded.group_id, RUNNING,
                                                  GroupStatus.DISCARDED))
    assert await notices_of(store, discarded.group_id) == []


async def test_of_racing_ends_on_several_connections_the_notice_exists_iff_done_won(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(2)]
    for _ in range(5):
        new = group()
        await stores[0].insert_attempt_group(new, attempt_jobs(2), TTL_S)
        won: list[GroupStatus] = []

        async def end(s: JobStore, status: GroupStatus, group_id: str = new.group_id,
                      won: list[GroupStatus] = won) -> None:
            if await s.end_attempt_group(GroupEnd(group_id, RUNNING, status)):
                won.append(status)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(end, stores[i % 2],
                              GroupStatus.DONE if i % 2 else GroupStatus.DISCARDED)
        assert len(won) == 1
        notices = await notices_of(stores[1], new.group_id)
        assert len(notices) == (1 if won[0] is GroupStatus.DONE else 0)


async def test_a_group_notice_is_claimed_once_and_settled_by_its_holder(store: JobStore) -> None:
    new = group()
    await store.insert_attempt_group(new, attempt_jobs(2), TTL_S)
    assert await store.end_attempt_group(GroupEnd(new.group_id, RUNNING, GroupStatus.DONE))
    notice_id = group_notice_id(new.group_id, "done")
    first = [n.id for n in await store.claim_notices("deliverer-a", 60.0, MANY)]
    second = [n.id for n in await store.claim_notices("deliverer-b", 60.0, MANY)]
    assert notice_id in first and notice_id not in second
    assert not await store.settle_notice(notice_id, "deliverer-b", "delivered")
    assert await store.settle_notice(notice_id, "deliverer-a", "delivered")
    [settled] = await notices_of(store, new.group_id)
    assert settled.delivered_at is not None and settled.outcome == "delivered"
