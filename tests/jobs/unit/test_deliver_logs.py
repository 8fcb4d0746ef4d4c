"""What the deliverer logs as it settles notices: every short job's skipped notice at debug
(`notices` lists it), anything an operator must see (a failed one) at info."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import structlog

from gateway.jobs.notify.deliver import Deliverer
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import MakeSettings
from tests.store.contract_helpers import OWNER, done, new_job, running

pytestmark = pytest.mark.anyio


async def ended_job(store: MemoryJobStore) -> str:
    job = new_job()
    await running(store, job)
    assert await store.complete(job.id, OWNER, done())
    return job.id


def settled(logs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(entry["log_level"], entry["outcome"]) for entry in logs
            if entry.get("action") == "settle_notice"]


async def test_a_notice_with_no_sink_is_settled_skipped_at_debug(
        store: MemoryJobStore, unit_settings: MakeSettings) -> None:
    await ended_job(store)
    deliverer = Deliverer(unit_settings(), store, "deliverer")
    with structlog.testing.capture_logs() as logs:
        assert await deliverer.sweep() == 1
    assert settled(logs) == [("debug", "skipped")]


async def test_a_notice_past_its_attempts_is_settled_failed_at_info(
        store: MemoryJobStore, unit_settings: MakeSettings) -> None:
    await ended_job(store)
    settings = unit_settings(notify={"max_attempts": 1, "command": ["notify-me"]})
    deliverer = Deliverer(settings, store, "deliverer")
    # Two claims that never settle: as if two deliverers died holding it.
    for claimant in ("dead-1", "dead-2"):
        assert len(await store.claim_notices(claimant, 0.0, 10)) == 1
    with structlog.testing.capture_logs() as logs:
        assert await deliverer.sweep() == 1
    assert settled(logs) == [("info", "failed")]
