"""The one-sweeper-per-interval claim (issue 29), on every backend and through PgBouncer:
one winner per interval whoever races, on the store's clock, counted."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.store.base import JobStore
from tests.waiting import scaled

pytestmark = pytest.mark.anyio


def task() -> str:
    return f"reaper@test-{uuid.uuid4().hex[:8]}"


async def test_a_claim_is_granted_once_per_interval(store: JobStore) -> None:
    name = task()
    assert await store.sweep_runs(name) == 0
    assert await store.claim_sweep(name, 60.0) is True
    assert await store.claim_sweep(name, 60.0) is False  # the interval is taken
    assert await store.sweep_runs(name) == 1


async def test_the_next_interval_is_claimed_once_the_last_claim_is_old_enough_on_the_store_clock(
        store: JobStore) -> None:
    name = task()
    assert await store.claim_sweep(name, 0.3)
    claimed_at = await store.now()
    with anyio.fail_after(scaled(30)):
        while not await store.claim_sweep(name, 0.3):
            await anyio.sleep(0.02)
    assert await store.now() - claimed_at >= 0.3 - 0.05  # never early (store clock)
    assert await store.sweep_runs(name) == 2


async def test_tasks_are_claimed_independently(store: JobStore) -> None:
    first, second = task(), task()
    assert await store.claim_sweep(first, 60.0)
    assert await store.claim_sweep(second, 60.0)
    assert (await store.sweep_runs(first), await store.sweep_runs(second)) == (1, 1)


async def test_of_many_racing_claimers_on_several_connections_exactly_one_wins(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(4)]
    name = task()
    wins: list[bool] = []

    async def claim(s: JobStore) -> None:
        wins.append(await s.claim_sweep(name, 60.0))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(claim, stores[i % len(stores)])
    assert sorted(wins) == [False] * 19 + [True]
    assert await stores[0].sweep_runs(name) == 1
