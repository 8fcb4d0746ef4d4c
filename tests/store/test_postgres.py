"""PostgreSQL-only behaviour of PostgresJobStore: the database clock, concurrent migration,
surviving a server restart, and row-lock races between heartbeat and reaper.

The shared contract (every backend) lives in test_contract_*.py; these tests cover what only a
shared PostgreSQL server can get wrong.
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest

from gateway.model import ORPHANED_ERROR, Completion, InstanceRow, JobRow, JobStatus, NewJob, Progress
from gateway.store.base import (
    REAPER_BATCH_ROWS,
    SCHEMA_VERSION,
    DuplicateActiveJob,
    StoreUnavailable,
)
from gateway.store.postgres.pool import (
    APPLICATION_NAME,
    IDLE_IN_TRANSACTION_TIMEOUT_MS,
    LOCK_TIMEOUT_MS,
    STATEMENT_TIMEOUT_MS,
)
from gateway.store.postgres.sql import (
    LIST_EXPIRED_CANDIDATES,
    LOCK_EXPIRED_OWNERS,
    RECOVER_EXPIRED_LEASES,
    RENEW_INSTANCE_LEASE,
)
from gateway.store.postgres.store import PostgresJobStore
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

SKEW = timedelta(days=1)  # far beyond any real clock drift, so a mix-up cannot hide
NEAR_S = 300.0  # "written by this clock": within the test's own running time of it
WAIT_S = 10.0  # bound on every condition wait
SECRET = "pg-s3cret-hunter2"  # a DSN password that must never show up in an error


def new_job(owner: str, *, key: str | None = None, transport: str = "process") -> NewJob:
    return NewJob(
        id=str(uuid.uuid4()),
        provider="claude",
        request_key=key or uuid.uuid4().hex,
        owner_instance=owner,
        transport=transport,
        hostname="host-a",
        boot_id="boot-a",
    )


def instance(instance_id: str) -> InstanceRow:
    return InstanceRow(
        instance_id=instance_id, hostname="host-a", boot_id="boot-a", pid=4242,
        pid_started_at=1_700_000_000.0, role="stdio", version="test",
    )


def dbname_of(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def with_query(dsn: str, **params: str) -> str:
    """asyncpg passes unknown DSN query parameters to the server as session settings."""
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{dsn}&{query}" if "?" in dsn else f"{dsn}?{query}"


async def reap(store: PostgresJobStore, http_grace_s: float = 0.0) -> list[JobRow]:
    """One sweep as the reaper does it: list the candidates, orphan those still expired."""
    candidates = await store.list_expired_candidates(http_grace_s)
    return await store.recover_expired_leases(http_grace_s, [row.id for row in candidates])


@pytest.fixture
async def pg_store(postgres_dsn: str) -> AsyncIterator[PostgresJobStore]:
    store = PostgresJobStore(postgres_dsn, max_size=4)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def skew_database_clock(dsn: str, skew: timedelta) -> None:
    """Make `now()` in this database run `skew` away from the real (client) clock.

    An unqualified `now()` resolves through search_path; with pg_catalog listed explicitly
    AFTER our schema, `clock_skew.now()` shadows `pg_catalog.now()` for every new session.
    """
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE SCHEMA clock_skew")
        await conn.execute(
            "CREATE FUNCTION clock_skew.now() RETURNS timestamptz LANGUAGE sql STABLE AS "
            f"$$ SELECT pg_catalog.now() + interval '{int(skew.total_seconds())} seconds' $$"
        )
        await conn.execute(
            f'ALTER DATABASE "{dbname_of(dsn)}" SET search_path = public, clock_skew, pg_catalog'
        )
    finally:
        await conn.close()


async def wait_until_server_passes(store: PostgresJobStore, moment: datetime) -> None:
    with anyio.fail_after(scaled(WAIT_S)):
        while await store.now() <= moment.timestamp():
            await anyio.sleep(0.01)


def assert_written_by(clock_s: float, *times: datetime | None) -> None:
    for value in times:
        assert value is not None
        assert value.utcoffset() == timedelta(0)
        assert abs(value.timestamp() - clock_s) < NEAR_S, (value, clock_s)


# -- (1) clocks -----------------------------------------------------------------------------


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["server_ahead", "server_behind"])
async def test_every_time_written_or_compared_is_the_database_clock(
    postgres_dsn: str, skew: timedelta
) -> None:
    """The database clock runs a day away from this process's clock; nothing changes.

    Shifting the server's `now()` by a day relative to the client is the same experiment as
    skewing the client's clock by a day, only reproducible. If any statement sent a client
    timestamp (a `datetime` parameter) or compared a column with one, then (a) the written
    times would sit a day away from `store.now()`, and (b) the lease, dedup-window,
    retention and instance-GC decisions would flip: ahead, an expired lease would look a day
    in the future and never be recovered; behind, a fresh lease would look a day old and be
    recovered at once, and fresh completed jobs would be purged. Both directions run.
    """
    await skew_database_clock(postgres_dsn, skew)
    store = PostgresJobStore(postgres_dsn, max_size=2)
    await store.open()
    try:
        server_now = await store.now()
        assert abs(server_now - (time.time() + skew.total_seconds())) < NEAR_S

        # The owner's own lease is over at once: only the jobs' leases decide.
        await store.register_instance(instance("i-1"), ttl_s=0)
        alive = await store.insert_job(new_job("i-1"), ttl_s=3600)
        expired = await store.insert_job(new_job("i-1"), ttl_s=0)
        assert alive.lease_deadline is not None and alive.created_at is not None
        # The deadline is the server's now() plus the duration, computed in one statement.
        assert alive.lease_deadline - alive.created_at == timedelta(seconds=3600)
        assert_written_by(server_now, alive.created_at, alive.updated_at, expired.created_at)

        await wait_until_server_passes(store, expired.lease_deadline or datetime.now(UTC))
        candidates = await store.list_expired_candidates(http_grace_s=0)
        assert [row.id for row in candidates] == [expired.id]
        recovered = await reap(store)
        assert [row.id for row in recovered] == [expired.id]
        assert_written_by(server_now, recovered[0].finished_at)
        still = await store.get_job(alive.id)
        assert still is not None and still.status is JobStatus.QUEUED

        assert await store.mark_running(alive.id, "i-1", ttl_s=60)
        assert await store.heartbeat("i-1", ttl_s=120) == 1
        (owner,) = await store.list_instances()
        assert owner.lease_expires_at is not None
        left = owner.lease_expires_at.timestamp() - await store.now()
        assert 0 < left <= 120
        renewed = await store.get_job(alive.id)
        assert renewed is not None
        assert_written_by(server_now, renewed.started_at)

        cancelled = await store.request_cancel(alive.id)
        assert cancelled is not None
        assert_written_by(server_now, cancelled.cancel_requested_at)
        assert await store.complete(alive.id, "i-1", Completion(status=JobStatus.COMPLETED))

        # Retention and dedup measured on the server clock: finished "just now".
        assert await store.purge_terminal(older_than_s=3600) == []
        assert await store.gc_instances(older_than_s=3600) == 0
        (row,) = await store.list_instances()
        assert_written_by(server_now, row.started_at, row.heartbeat_at, row.lease_expires_at)
        await store.mark_instance_stopped("i-1")
        (row,) = await store.list_instances()
        assert_written_by(server_now, row.stopped_at)

        # The remaining writers stamp the server clock too.
        running = await store.insert_job(new_job("i-1"), ttl_s=60)
        assert await store.mark_running(running.id, "i-1", ttl_s=60)
        assert await store.record_process(running.id, "i-1", 7, 7, 1.0)
        assert await store.save_progress(running.id, "i-1", Progress(3, "abc"))
        progressed = await store.get_job(running.id)
        assert progressed is not None
        assert_written_by(server_now, progressed.updated_at)
        assert await store.request_cancel(running.id) is not None
        assert await store.complete(running.id, "i-1", Completion(status=JobStatus.FAILED))
        for job_id in (running.id,):
            final = await store.get_job(job_id)
            assert final is not None and final.status.is_terminal
            assert_written_by(server_now, final.finished_at, final.updated_at)
    finally:
        await store.close()


async def test_completed_job_is_reused_within_the_window_on_the_database_clock(
    postgres_dsn: str,
) -> None:
    """With the server a day behind the client, a job completed a second ago (server time)
    is still reusable; a client-clock window would see it as a day old."""
    await skew_database_clock(postgres_dsn, -SKEW)
    store = PostgresJobStore(postgres_dsn, max_size=2)
    await store.open()
    try:
        job = await store.insert_job(new_job("i-1", key="same-request"), ttl_s=60)
        assert await store.complete(job.id, "i-1", Completion(status=JobStatus.COMPLETED))
        reused = await store.find_reusable("same-request", dedup_window_s=60)
        assert reused is not None and reused.id == job.id
    finally:
        await store.close()


async def test_results_do_not_depend_on_the_session_time_zone(postgres_dsn: str) -> None:
    """Two instances whose sessions run in far-apart time zones (+13:45, -02:30/-03:30)
    agree on every deadline and every decision: times travel as absolute instants."""
    zones = ("Pacific/Chatham", "America/St_Johns")
    stores = [PostgresJobStore(with_query(postgres_dsn, TimeZone=z), max_size=2) for z in zones]
    for store in stores:
        await store.open()
    try:
        east, west = stores
        probe = await asyncpg.connect(with_query(postgres_dsn, TimeZone=zones[0]))
        try:
            assert await probe.fetchval("SHOW TimeZone") == zones[0]
        finally:
            await probe.close()

        await east.register_instance(instance("east"), ttl_s=0)  # only job leases decide
        long_lived = await east.insert_job(new_job("east"), ttl_s=3600)
        short_lived = await west.insert_job(new_job("east"), ttl_s=0)

        seen_east = await east.get_job(long_lived.id)
        seen_west = await west.get_job(long_lived.id)
        assert seen_east == seen_west
        assert seen_west is not None and seen_west.created_at is not None
        assert seen_west.created_at.tzinfo is not None
        assert seen_west.created_at.utcoffset() == timedelta(0)

        await wait_until_server_passes(west, short_lived.lease_deadline or datetime.now(UTC))
        # The west instance reaps exactly what the east instance's leases say expired...
        recovered = await reap(west)
        assert [row.id for row in recovered] == [short_lived.id]
        # ...and the east instance's heartbeat lands a lease the west reads identically.
        assert await east.heartbeat("east", ttl_s=120) == 1
        assert await east.list_instances() == await west.list_instances()
        assert await west.list_expired_candidates(http_grace_s=0) == []
    finally:
        for store in stores:
            await store.close()


# -- (2) migration ------------------------------------------------------------------------


async def test_a_schema_from_a_newer_gateway_is_refused(postgres_dsn: str) -> None:
    store = PostgresJobStore(postgres_dsn, max_size=1)
    await store.open()
    await store.close()
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES ($1, now())",
            SCHEMA_VERSION + 1,
        )
        # ...by a gateway that recorded no lowest writer this one satisfies (store/compat.py).
        await conn.execute("DELETE FROM schema_meta")
    finally:
        await conn.close()
    newer = PostgresJobStore(postgres_dsn, max_size=1)
    with pytest.raises(StoreUnavailable, match="upgrade agent-cli-gateway"):
        await newer.open()
    with pytest.raises(StoreUnavailable, match="not open"):
        await newer.get_job("x")


# -- (3) outages --------------------------------------------------------------------------


def assert_no_secret(exc: BaseException) -> None:
    rendered = "".join(traceback.format_exception(exc))
    assert SECRET not in rendered
    assert SECRET not in repr(exc)


async def test_store_works_again_after_the_server_restarts(
    postgres_server: Any, postgres_dsn: str
) -> None:
    """Stop PostgreSQL under an open pool: every call fails with StoreUnavailable (never
    another exception, never the password); once the server is back, the next call works
    and broken connections do not linger in the pool."""
    server = postgres_server  # tests/conftest.py PostgresServer
    dsn = server.dsn_for(dbname_of(postgres_dsn), password=SECRET)
    store = PostgresJobStore(dsn, max_size=2)
    await store.open()
    try:
        await store.register_instance(instance("i-1"), ttl_s=90)
        job = await store.insert_job(new_job("i-1"), ttl_s=60)

        await anyio.to_thread.run_sync(server.stop)
        try:
            calls = [
                lambda: store.get_job(job.id),
                lambda: store.heartbeat("i-1", ttl_s=90),
                lambda: store.insert_job(new_job("i-1"), ttl_s=60),
                lambda: store.recover_expired_leases(0, [job.id]),
                lambda: store.list_jobs(),
                store.now,
            ]
            for call in calls:
                with pytest.raises(StoreUnavailable) as info:
                    await call()
                assert_no_secret(info.value)
        finally:
            await anyio.to_thread.run_sync(server.start)

        again = await store.get_job(job.id)
        assert again is not None and again.id == job.id
        # Both pooled connections are usable at once: none was left broken in the pool.
        results: list[JobRow | None] = []

        async def read() -> None:
            results.append(await store.get_job(job.id))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(read)
        assert [row.id if row else None for row in results] == [job.id] * 4
        assert await store.heartbeat("i-1", ttl_s=90) == 1
    finally:
        await store.close()


@pytest.mark.slow  # binds a port (the address nobody listens on)
async def test_unreachable_server_is_unavailable_and_the_password_stays_secret() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = PostgresJobStore(f"postgresql://gateway:{SECRET}@127.0.0.1:{port}/jobs")
    with pytest.raises(StoreUnavailable) as info:
        await store.open()
    assert_no_secret(info.value)
    assert SECRET not in repr(store)


# -- races on row locks ---------------------------------------------------------------------


async def wait_for_lock_wait(admin: asyncpg.Connection) -> None:
    """Until one of the store's sessions is blocked on a row lock."""
    with anyio.fail_after(scaled(WAIT_S)):
        while not await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = $1 AND wait_event_type = 'Lock'",
            APPLICATION_NAME,
        ):
            await anyio.sleep(0.01)


async def test_a_heartbeat_in_progress_saves_its_job_from_a_reaper_that_skips_its_owner(
    pg_store: PostgresJobStore, postgres_dsn: str
) -> None:
    """A heartbeat holds the owner's row lock while the reaper sweeps: the reaper neither
    waits for it (SKIP LOCKED) nor judges that owner's jobs, so the renewed lease saves the
    job (no select-then-flip through the join)."""
    await pg_store.register_instance(instance("owner"), ttl_s=0)
    job = await pg_store.insert_job(new_job("owner"), ttl_s=0)
    await wait_until_server_passes(pg_store, job.lease_deadline or datetime.now(UTC))
    heartbeat = await asyncpg.connect(postgres_dsn)
    try:
        tx = heartbeat.transaction()
        await tx.start()
        await heartbeat.execute(RENEW_INSTANCE_LEASE, "owner", 60.0, None)  # holds the row lock
        with anyio.fail_after(LOCK_TIMEOUT_MS / 1000 / 2):  # never waits for the lock
            assert await reap(pg_store) == []
        await tx.commit()
        assert await reap(pg_store) == []
        row = await pg_store.get_job(job.id)
        assert row is not None and row.status is JobStatus.QUEUED
    finally:
        await heartbeat.close()


async def test_a_reaper_that_commits_first_is_not_undone_by_a_late_heartbeat(
    pg_store: PostgresJobStore, postgres_dsn: str
) -> None:
    await pg_store.register_instance(instance("owner"), ttl_s=0)
    job = await pg_store.insert_job(new_job("owner"), ttl_s=0)
    await wait_until_server_passes(pg_store, job.lease_deadline or datetime.now(UTC))
    reaper = await asyncpg.connect(postgres_dsn)
    admin = await asyncpg.connect(postgres_dsn)
    try:
        tx = reaper.transaction()
        await tx.start()
        assert [r["instance_id"] for r in await reaper.fetch(LOCK_EXPIRED_OWNERS)] == ["owner"]
        flipped = await reaper.fetch(RECOVER_EXPIRED_LEASES, 0.0, [job.id], ORPHANED_ERROR,
                                     ["owner"], "host-1")
        assert [r["id"] for r in flipped] == [job.id]
        renewed: list[int] = []

        async def beat() -> None:
            renewed.append(await pg_store.heartbeat("owner", ttl_s=60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            await wait_for_lock_wait(admin)
            await tx.commit()
        assert renewed == [1]  # the instance row is renewed...
        row = await pg_store.get_job(job.id)
        # ...but the orphaned job stays orphaned: its lease is not revived.
        assert row is not None and row.status is JobStatus.ORPHANED
        assert row.lease_deadline is None
    finally:
        await reaper.close()
        await admin.close()


async def test_two_instances_racing_the_same_request_get_exactly_one_job(
    postgres_dsn: str,
) -> None:
    stores = [PostgresJobStore(postgres_dsn, max_size=5) for _ in range(2)]
    for store in stores:
        await store.open()
    try:
        winners: list[str] = []
        losers: list[str | None] = []

        async def admit(store: PostgresJobStore) -> None:
            try:
                winners.append((await store.insert_job(new_job("i", key="k"), ttl_s=60)).id)
            except DuplicateActiveJob as exc:
                losers.append(exc.existing_id)

        async with anyio.create_task_group() as tg:
            for index in range(10):
                tg.start_soon(admit, stores[index % 2])
        assert len(winners) == 1
        assert losers == winners * 9
    finally:
        for store in stores:
            await store.close()


# -- indexes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "args", "index"),
    [
        # From the expired owners to their jobs, or from the few active jobs to owners.
        (LOCK_EXPIRED_OWNERS, (), "jobs_owner_status|jobs_status_finished"),
        # The candidates it was given, by primary key.
        (RECOVER_EXPIRED_LEASES, (0.0, [], ORPHANED_ERROR, [], "host-1"),
         "jobs_pkey|jobs_status_lease_deadline"),
        (LIST_EXPIRED_CANDIDATES, (0.0, REAPER_BATCH_ROWS), "jobs_status_lease_deadline"),
    ],
    ids=["reaper_owners", "reaper", "reaper_candidates"],
)
async def test_reaper_statements_can_use_their_index(
    pg_store: PostgresJobStore, postgres_dsn: str, statement: str, args: tuple[Any, ...],
    index: str,
) -> None:
    """Their WHERE clauses are index-compatible (a planner forbidden to scan the table
    still finds a plan through the index), so their cost does not grow with old rows."""
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {statement}", *args))
    finally:
        await conn.close()
    assert any(name in plan for name in index.split("|")), plan
    assert "Seq Scan on jobs" not in plan, plan


# -- one stalled peer never stalls the others (issue 15, item 10) ---------------------------


async def test_a_job_row_locked_by_a_stalled_peer_does_not_stall_the_sweep(
    pg_store: PostgresJobStore, postgres_dsn: str
) -> None:
    """Regression: a SIGSTOPped gateway holding one job's row lock (inside its completion
    or reaper transaction) made every sweep fail with LockNotAvailableError. The reaper
    skips that row and orphans the rest; the row is orphaned once it is released."""
    jobs = [await pg_store.insert_job(new_job("gone"), ttl_s=0) for _ in range(3)]
    await wait_until_server_passes(pg_store, jobs[-1].lease_deadline or datetime.now(UTC))
    peer = await asyncpg.connect(postgres_dsn)
    try:
        tx = peer.transaction()
        await tx.start()
        await peer.execute("SELECT id FROM jobs WHERE id = $1 FOR UPDATE", jobs[0].id)
        with anyio.fail_after(LOCK_TIMEOUT_MS / 1000 / 2):  # never waits for the lock
            flipped = await reap(pg_store)
        assert sorted(r.id for r in flipped) == sorted(j.id for j in jobs[1:])
        held = await pg_store.get_job(jobs[0].id)
        assert held is not None and held.status is JobStatus.QUEUED
        await tx.rollback()
        assert [r.id for r in await reap(pg_store)] == [jobs[0].id]
    finally:
        await peer.close()


async def test_a_lapsed_owner_locked_by_a_stalled_peer_leaves_only_its_jobs_for_later(
    pg_store: PostgresJobStore, postgres_dsn: str
) -> None:
    """Another reaper that stopped inside its transaction holds a lapsed owner's row: this
    sweep skips that owner's jobs (it cannot lock out its heartbeat) and orphans the rest."""
    await pg_store.register_instance(instance("stuck-owner"), ttl_s=0)
    held = await pg_store.insert_job(new_job("stuck-owner"), ttl_s=0)
    free = await pg_store.insert_job(new_job("gone"), ttl_s=0)
    await wait_until_server_passes(pg_store, free.lease_deadline or datetime.now(UTC))
    peer = await asyncpg.connect(postgres_dsn)
    try:
        tx = peer.transaction()
        await tx.start()
        assert [r["instance_id"] for r in await peer.fetch(LOCK_EXPIRED_OWNERS)] == [
            "stuck-owner"]
        with anyio.fail_after(LOCK_TIMEOUT_MS / 1000 / 2):
            assert [r.id for r in await reap(pg_store)] == [free.id]
        row = await pg_store.get_job(held.id)
        assert row is not None and row.status is JobStatus.QUEUED
        await tx.rollback()
        assert [r.id for r in await reap(pg_store)] == [held.id]
    finally:
        await peer.close()


async def test_a_heartbeat_succeeds_while_slow_reads_hold_every_pooled_connection(
    postgres_dsn: str,
) -> None:
    """Regression: the heartbeat borrowed from the pool that result reads and COPYs use,
    and could wait about 55 s for it. It has a connection of its own."""
    store = PostgresJobStore(postgres_dsn, max_size=2)
    await store.open()
    try:
        await store.register_instance(instance("busy"), ttl_s=60)
        slow_s = 4.0

        async def slow_read() -> None:
            async with store._connection("slow read") as conn:
                await conn.execute(f"SELECT pg_sleep({slow_s})")

        async with anyio.create_task_group() as tg:
            for _ in range(3):  # more than the pool holds: one waits for a connection
                tg.start_soon(slow_read)
            await anyio.sleep(0.3)  # the reads have taken the pool
            started = time.monotonic()
            with anyio.fail_after(slow_s / 2):
                assert await store.heartbeat("busy", ttl_s=60) == 1
                await store.now()
            assert time.monotonic() - started < slow_s / 2
    finally:
        await store.close()


async def test_gateway_sessions_carry_server_side_statement_and_idle_transaction_timeouts(
    pg_store: PostgresJobStore,
) -> None:
    """A stalled transaction's locks are released by the server itself: every session of
    both pools has statement_timeout and idle_in_transaction_session_timeout set."""
    expected = {"statement_timeout": f"{STATEMENT_TIMEOUT_MS // 1000}s",
                "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"}
    for lease in (False, True):
        async with pg_store._connection("probe", lease=lease) as conn:
            seen = {name: await conn.fetchval(f"SHOW {name}") for name in expected}
        assert seen == expected, (lease, seen)


# -- PgBouncer in transaction pooling mode (issue #29) ------------------------------------


async def test_through_pgbouncer_a_direct_mode_store_is_refused_and_a_pooler_one_opens(
    pgbouncer_dsn: str,
) -> None:
    """The fixture really is PgBouncer in transaction mode: it refuses the startup
    parameters a direct connection carries (what main did: no request was ever admitted).
    With `pooler = "pgbouncer"` the store opens, and every call's transaction carries the
    timeouts a direct session gets at startup."""
    direct = PostgresJobStore(pgbouncer_dsn, max_size=1)
    with pytest.raises(StoreUnavailable, match="unsupported startup parameter"):
        await direct.open()
    store = PostgresJobStore(pgbouncer_dsn, max_size=2, pooler="pgbouncer")
    await store.open()
    try:
        expected = {"statement_timeout": f"{STATEMENT_TIMEOUT_MS // 1000}s",
                    "lock_timeout": f"{LOCK_TIMEOUT_MS // 1000}s",
                    "idle_in_transaction_session_timeout":
                        f"{IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"}
        for lease in (False, True):
            async with store._connection("probe", lease=lease) as conn:
                assert conn.is_in_transaction()
                seen = {name: await conn.fetchval(f"SHOW {name}") for name in expected}
            assert seen == expected, (lease, seen)
        await store.register_instance(instance("pgb"), ttl_s=60)
        job = await store.insert_job(new_job("pgb", key="twin"), ttl_s=60)
        with pytest.raises(DuplicateActiveJob):  # a failed statement under a savepoint
            await store.insert_job(new_job("pgb", key="twin"), ttl_s=60)
        assert await store.heartbeat("pgb", ttl_s=60) == 1
        assert (await store.get_job(job.id)) is not None
        stats = store.pool_stats()
        assert stats["pooler"] == "pgbouncer"
    finally:
        await store.close()
