"""An admitted job waits for its store to launch, it does not fail (issue #29): the store
refusing the queued -> running write (SQLite's write lock held by another process past its
busy timeout, a PostgreSQL row lock past its lock timeout) leaves the job queued, and it
runs once the store answers again. It used to end `launch_failed` with "internal gateway
error" at the first refused write."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
import structlog

from gateway.jobs.requests import SubmitRequest
from gateway.model import JobStatus
from gateway.store.base import StoreUnavailable
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, job_row, leases_of, store_of
from tests.jobs.test_detach import claude_job, terminal
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Leases far longer than the held lock: only the launch's write may meet it.
PATIENT_LEASE = {"ttl_s": 30.0, "instance_gc_s": 60.0, "http_job_grace_s": 30.0,
                 "heartbeat_s": 1.0}
REFUSAL_BOUND_S = 60.0  # the store's own patience (5 s busy or lock timeout), loaded box


@asynccontextmanager
async def sqlite_write_lock(path: str) -> AsyncIterator[None]:
    """Another process's writer holding the file's write lock (readers go on: WAL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@asynccontextmanager
async def postgres_row_lock(dsn: str, job_id: str) -> AsyncIterator[None]:
    """Another session holding the job's row lock (every other row stays writable)."""
    conn = await asyncpg.connect(dsn)
    try:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job_id)
        yield
        await transaction.rollback()
    finally:
        await conn.close()


async def test_an_admitted_job_waits_for_a_refusing_store_then_runs_once(
    backend: str, make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    request: pytest.FixtureRequest,
) -> None:
    settings = make_settings(lease=PATIENT_LEASE, limits={"max_running_jobs": 1})
    gateway = await start_gateway(settings)
    manager = await gateway.manager()
    held = manager.limiter.acquire("claude")  # the one run slot's stand-in: B waits for it
    assert held.granted
    sub = await manager.submit("claude", SubmitRequest(prompt="launch after the lock"))
    assert (await job_row(store_of(gateway), sub.job.id)).status is JobStatus.QUEUED

    lock: Callable[[], Any]
    if backend == "sqlite":
        lock = lambda: sqlite_write_lock(str(settings.persistence.path))  # noqa: E731
    else:
        lock = lambda: postgres_row_lock(request.getfixturevalue("postgres_dsn"),  # noqa: E731
                                         sub.job.id)
    with structlog.testing.capture_logs() as logs:
        async with lock():
            held.release()  # B's slot: its driver now tries queued -> running, and is refused
            await wait_for(lambda: any(e["event"] == "job waits for the store to launch"
                                       and e.get("job_id") == sub.job.id for e in logs),
                           REFUSAL_BOUND_S)
            assert not fake_log.spawns()  # nothing launched behind the refused write
        row = await wait_for(lambda: terminal(manager, sub.job.id), REFUSAL_BOUND_S)
    assert (row.status, row.error_kind) == (JobStatus.COMPLETED, None), row
    assert len(fake_log.spawns()) == 1


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_requeue_the_store_refuses_gives_its_queue_slot_back(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    """A re-queue whose CAS the store refused held its queue slot for good (one slot less
    for every refusal, until the gateway refused all work as saturated)."""
    settings = make_settings(lease=PATIENT_LEASE)
    gateway = await start_gateway(settings)
    keeper = leases_of(gateway)
    await keeper.stop()  # no sweep of its own: the test makes the one re-queue
    job = claude_job(31, "requeued after the refusal", "ghost")  # its owner has no row
    await store_of(gateway).insert_job(job, settings.lease.ttl_s)
    row = await job_row(store_of(gateway), job.id)
    manager = await gateway.manager()
    async with sqlite_write_lock(str(settings.persistence.path)):
        with pytest.raises(StoreUnavailable):
            await keeper.adopter.requeue(row, "owner_collected")
    snapshot = manager.limiter.snapshot()
    assert (snapshot["queued"], snapshot["running"]) == (0, 0), snapshot
    assert await keeper.adopter.requeue(row, "owner_collected") == 1  # the store answers
    done = await wait_for(lambda: terminal(manager, job.id), REFUSAL_BOUND_S)
    assert done.status is JobStatus.COMPLETED
    assert fake_log.prompts() == ["requeued after the refusal"]
