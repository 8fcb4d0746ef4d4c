"""The uncharged re-queue lane is bounded (docs/architecture.md; lease.max_requeues): each
re-queue is recorded with its reason, and a job that keeps losing its owner ends failed
(`requeue_limit`) instead of walking through every gateway. Real gateways, real store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, JobStatus
from gateway.store import open_store
from gateway.store.base import TakeOver
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, here
from tests.jobs.test_detach import DONE_S, claude_job, terminal
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio


async def test_a_requeue_records_its_reason_and_counts(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings()
    job = claude_job(21, "requeued once", "ghost")  # its owner has no row: gone
    store = await open_store(settings)
    try:
        await store.insert_job(job, settings.lease.ttl_s)
    finally:
        await store.close()
    manager = await (await start_gateway(settings)).manager()
    row = await wait_for(lambda: terminal(manager, job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.requeue_count == 1
    (reason,) = json.loads(row.requeue_reasons)
    assert reason["reason"] == "owner_collected" and reason["previous_owner"] == "ghost"
    assert fake_log.prompts() == ["requeued once"]


async def test_a_job_that_keeps_losing_its_owner_ends_failed_and_its_gateway_serves_on(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings(lease={"max_requeues": 3})
    job = claude_job(22, "poison", "ghost-0")
    store = await open_store(settings)
    try:
        await store.insert_job(job, settings.lease.ttl_s)
        now = await store.now()
        # Three owners in a row were proven gone before it started (each took it over).
        for n in range(3):
            reasons = [{"at": now, "reason": "owner_dead", "previous_owner": f"ghost-{i}"}
                       for i in range(n + 1)]
            taken = await store.requeue_job(TakeOver(
                job_id=job.id, expected_owner=f"ghost-{n}", expected_status=JobStatus.QUEUED,
                instance_id=f"ghost-{n + 1}", ttl_s=settings.lease.ttl_s,
                requeue_reasons=json.dumps(reasons), **here()))
            assert taken is not None and taken.requeue_count == n + 1
    finally:
        await store.close()
    manager = await (await start_gateway(settings)).manager()
    row: Any = await wait_for(lambda: terminal(manager, job.id), DONE_S)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.REQUEUE_LIMIT
    assert row.requeue_count == 3 and "3 re-queues" in row.error
    assert fake_log.prompts() == []  # never launched
    # The gateway that ended it still serves.
    sub = await manager.submit("claude", SubmitRequest(prompt="after the poison"))
    done = await wait_for(lambda: terminal(manager, sub.job.id), DONE_S)
    assert done.status is JobStatus.COMPLETED
