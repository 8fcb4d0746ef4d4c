"""Wakeups without polling (issue 29): a waiter on another connection returns when the job's
row changes, on a real PostgreSQL; behind PgBouncer (no session for LISTEN) and when the
listener's connection is lost, the wait falls back to its timeout, the caller's poll."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import asyncpg
import pytest

from gateway.store.postgres.store import PostgresJobStore
from tests.store.contract_helpers import OWNER, TTL_S, done, new_job, running

pytestmark = pytest.mark.anyio

LONG_S = 60.0  # a wait that, without a notice, would outlast the test's deadline


async def opened(dsn: str, pooler: str = "none") -> PostgresJobStore:
    store = PostgresJobStore(dsn, pooler=pooler)  # type: ignore[arg-type]
    await store.open()
    return store


async def woken_within(waiter: PostgresJobStore, job_id: str, change: Callable[[], Awaitable[object]],
                       deadline_s: float = 20.0) -> None:
    """`change` happens while `waiter` waits LONG_S on the job: the wait must end first."""
    returned = anyio.Event()

    async def wait() -> None:
        await waiter.wait_for_change(job_id, LONG_S)
        returned.set()

    with anyio.fail_after(deadline_s):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            # The waiter is registered with its listener: no outside sign shows that, so the
            # test reads the listener's table of waiters.
            notices = waiter._notices
            while job_id not in notices._waiters:
                await anyio.sleep(0.01)
            await change()
            await returned.wait()


async def test_a_terminal_write_on_another_connection_wakes_a_waiter(postgres_dsn: str) -> None:
    owner, waiter = await opened(postgres_dsn), await opened(postgres_dsn)
    try:
        job = await running(owner, new_job())
        await woken_within(waiter, job.id, lambda: owner.complete(job.id, OWNER, done()))
    finally:
        await owner.close()
        await waiter.close()


async def test_a_cancel_request_wakes_a_waiter(postgres_dsn: str) -> None:
    owner, waiter = await opened(postgres_dsn), await opened(postgres_dsn)
    try:
        job = await owner.insert_job(new_job(), TTL_S)
        await woken_within(waiter, job.id, lambda: owner.request_cancel(job.id))
    finally:
        await owner.close()
        await waiter.close()


async def test_a_lost_listener_wakes_its_waiters_and_the_next_wait_listens_again(
        postgres_dsn: str) -> None:
    owner, waiter = await opened(postgres_dsn), await opened(postgres_dsn)
    admin = await asyncpg.connect(postgres_dsn)
    try:
        job = await owner.insert_job(new_job(), TTL_S)

        async def kill_listener() -> None:
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE '% listener' AND datname = current_database()")
            assert killed == 1

        await woken_within(waiter, job.id, kill_listener)
        # A new listener comes up on the next wait, and notices arrive again.
        await woken_within(waiter, job.id, lambda: owner.request_cancel(job.id))
    finally:
        await admin.close()
        await owner.close()
        await waiter.close()


async def test_behind_pgbouncer_a_wait_is_the_poll(pgbouncer_dsn: str) -> None:
    store = await opened(pgbouncer_dsn, pooler="pgbouncer")
    try:
        job = await running(store, new_job())
        started = time.monotonic()
        await store.wait_for_change(job.id, 0.3)  # no LISTEN here: the whole timeout
        assert time.monotonic() - started >= 0.3
        assert await store.complete(job.id, OWNER, done())  # the trigger's NOTIFY is harmless
    finally:
        await store.close()
