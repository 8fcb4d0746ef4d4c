"""One sweeper per interval among many gateways on one store (issue 29): twenty instances
with their real loops, and the count of the sweeps they ran. The invariant (at most one
claimed sweep per interval) is exact; how many intervals had one depends on the box's
load, so the test asks only that sweeping went on (the 90 % figure is a bench row)."""

from __future__ import annotations

import anyio
import pytest

from gateway.store.base import JobStore
from tests.jobs.conftest import MakeSettings, StartGateway, leases_of
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

INSTANCES = 20
INTERVAL_S = 0.25


async def test_twenty_gateways_on_one_store_sweep_at_most_once_per_interval(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    settings = make_settings(lease={"sweep_interval_s": INTERVAL_S})
    gateways = [await start_gateway(settings) for _ in range(INSTANCES)]
    keepers = [leases_of(g) for g in gateways]
    store = (await gateways[0].manager()).store
    task = f"reaper@{keepers[0].identity.hostname}"
    # Wait until every gateway may judge (registered, a fresh lease), then count.
    await wait_for(lambda: all(k.renewed_at is not None for k in keepers), timeout=30)
    passes_before = sum(k.sweeps_run for k in keepers)
    runs_before, clock_before = await store.sweep_runs(task), await store.now()
    await wait_for(lambda: _runs_at_least(store, task, runs_before + 8), timeout=60)
    passes = sum(k.sweeps_run for k in keepers) - passes_before
    runs_after, clock_after = await store.sweep_runs(task), await store.now()
    intervals = (clock_after - clock_before) / (INTERVAL_S * 0.9)  # a claim's length
    # At most one pass per interval (plus the ones the window's edges may cut), whatever
    # the load: twenty loops that each swept would have made ~20 times as many. The
    # passes the gateways made are the claims the store counted.
    assert passes <= intervals + 2, (passes, intervals)
    assert abs(passes - (runs_after - runs_before)) <= 2, (passes, runs_after - runs_before)


async def _runs_at_least(store: JobStore, task: str, wanted: int) -> bool:
    await anyio.sleep(0.05)
    return await store.sweep_runs(task) >= wanted
