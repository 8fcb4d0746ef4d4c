"""The PostgreSQL store's connections: a small budget, patience with a full server, PgBouncer.

Why this module exists (docs/operations.md; issue #29): every stdio gateway (one per client
window) and every shared HTTP gateway uses one database, whose `max_connections` is 100 by
default. So a pool starts empty, holds at most `[persistence] pool_max` connections and closes
one that sat idle for a few seconds; the heartbeat has a pool of one of its own, so neither
waits behind the other.

"Too many clients" (SQLSTATE 53300) and "the server is starting" (57P03) are refusals of a
*new* connection: nothing was sent, so waiting and trying again with backoff is always safe.
Each call says how long it may wait (its patience): a tool's read or an admission a few
seconds (then the caller answers `unavailable`, retryable), an admitted job's own writes
minutes, so a job already admitted waits for its connection instead of failing.

Behind PgBouncer in transaction pooling mode (`pooler = "pgbouncer"`) a client connection
keeps no server session: PgBouncer refuses startup parameters it does not track, and a SET,
a named prepared statement, a LISTEN or a cursor WITH HOLD would land on whichever server
connection the next transaction gets. So: no startup parameters but `application_name`,
every call runs in a transaction that starts with `SET LOCAL` of the timeouts, asyncpg's
statement cache is off (`statement_cache_size=0`: unnamed statements only) and the pool's
session reset (`RESET ALL`, `UNLISTEN *` outside any transaction) is not sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import asyncpg
import structlog

from gateway.backoff import Backoff
from gateway.store.gauges import WorstOfLastHour

log = structlog.get_logger(__name__)

Pooler = Literal["none", "pgbouncer"]

CONNECT_TIMEOUT_S = 10.0  # an unreachable host must fail a call, not hang the heartbeat
COMMAND_TIMEOUT_S = 25.0  # a statement stuck behind a lock or a dying server gives up
CLOSE_TIMEOUT_S = 5.0  # close() waits this long for borrowed connections, then terminates
LOCK_TIMEOUT_MS = 5000  # a row lock held longer than this is a stuck peer: fail the call
# The server ends a statement that runs longer than the client would wait for it (so its
# locks go when the client gives up), and a session that sits idle inside a transaction
# this long: a gateway stopped (SIGSTOP, a stalled loop) in its reaper or completion
# transaction would otherwise hold its row locks, and stall its peers, until it resumes.
STATEMENT_TIMEOUT_MS = int(COMMAND_TIMEOUT_S * 1000)
IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000
APPLICATION_NAME = "agent-cli-gateway"  # so operators can find our sessions in pg_stat_activity

# A work connection idle this long is closed: an idle window holds none. The heartbeat's
# is closed sooner, since it is used for one round trip every heartbeat_s: forty idle
# windows then hold a few connections between them, not forty.
IDLE_RELEASE_S = 1.0
LEASE_IDLE_RELEASE_S = 0.1
# The heartbeat's own short bounds: a renewal that cannot happen within a few seconds has
# failed (and is retried next tick), rather than stalling the lease loop for a minute.
LEASE_COMMAND_TIMEOUT_S = 5.0

# Patience (how long a call may wait for a connection, a refused connect included):
READ_PATIENCE_S = 10.0  # a tool's read or an admission; then `unavailable` (retry)
WORK_PATIENCE_S = 120.0  # an admitted job's own writes: it waits rather than fails
LEASE_PATIENCE_S = 5.0  # a renewal; its caller counts failures (max_heartbeat_failures)
# A server refusing connects (too many clients): retry from 50 ms up to 2 s apart, each wait
# jittered so gateways refused together do not all come back in step.
BUSY_RETRY = Backoff(first_s=0.05, max_s=2.0, jitter=0.5)
# After the server refused one of our connects, a connection is closed as soon as its call
# is done instead of idling for IDLE_RELEASE_S: gateways sharing a full server hand slots to
# each other instead of each keeping one it does not use.
FULL_SERVER_S = 10.0
BUSY_LOG_EVERY_S = 30.0  # one warning per pool this often while the server stays full
# Refusals of a new connection that pass by themselves: nothing was sent yet.
BUSY_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.TooManyConnectionsError,  # 53300: max_connections reached
    asyncpg.CannotConnectNowError,  # 57P03: the server is starting or shutting down
)
WAITED_MS = 10.0  # an acquisition that took longer than this counts as a wait

# Behind PgBouncer the timeouts a direct connection gets as startup parameters.
SET_LOCAL_TIMEOUTS = (
    f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}; "
    f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}; "
    f"SET LOCAL idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}")


class FullServer:
    """When the server last refused a connect of this store (either pool): while that is
    recent, every connection is closed when its call is done. Shared by a store's two pools,
    so a gateway whose heartbeat is refused also stops keeping idle work connections."""

    def __init__(self) -> None:
        self._last_refused = -FULL_SERVER_S

    def refused(self) -> None:
        self._last_refused = time.monotonic()

    def recently(self) -> bool:
        return time.monotonic() - self._last_refused < FULL_SERVER_S


async def _no_session_reset(conn: asyncpg.Connection) -> None:
    """Behind PgBouncer: asyncpg has already rolled back an open transaction; the session
    reset it would send next (RESET ALL, UNLISTEN *, CLOSE ALL) has nothing to undo, since
    nothing here sets session state, and would run outside any transaction."""


class ConnectionPool:
    """One asyncpg pool (work or heartbeat) with its patience and its gauges."""

    def __init__(self, name: str, pool: asyncpg.Pool, pooler: Pooler,
                 full_server: FullServer) -> None:
        self.name = name
        self._pool = pool
        self._pooler = pooler
        self._full_server = full_server
        self.acquired = 0
        self.waited = 0  # acquisitions that took longer than WAITED_MS
        self.refused = 0  # connects refused with "too many clients" or "starting up"
        self.worst_wait_ms = WorstOfLastHour()
        self._last_busy_log = -BUSY_LOG_EVERY_S

    @classmethod
    async def create(cls, name: str, dsn: str, *, max_size: int, idle_s: float,
                     command_timeout_s: float, pooler: Pooler,
                     full_server: FullServer) -> ConnectionPool:
        """A pool that opens nothing until it is used and closes what sits idle."""
        options: dict[str, Any] = {}
        if pooler == "pgbouncer":
            options = {"server_settings": {"application_name": APPLICATION_NAME},
                       "statement_cache_size": 0, "reset": _no_session_reset}
        else:
            options = {"server_settings": {
                "application_name": APPLICATION_NAME,
                "lock_timeout": str(LOCK_TIMEOUT_MS),
                "statement_timeout": str(STATEMENT_TIMEOUT_MS),
                "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
            }}
        pool = await asyncpg.create_pool(
            dsn, min_size=0, max_size=max_size, max_inactive_connection_lifetime=idle_s,
            timeout=CONNECT_TIMEOUT_S, command_timeout=command_timeout_s, **options)
        return cls(name, pool, pooler, full_server)

    @asynccontextmanager
    async def connection(self, patience_s: float) -> AsyncIterator[asyncpg.Connection]:
        """A connection within `patience_s`, waiting out a full server with backoff.

        Raises what asyncpg raised (a refusal past the patience, TimeoutError, a broken
        connection): the store turns it into StoreUnavailable. Behind PgBouncer the body
        runs inside a transaction that set the timeouts (SET LOCAL)."""
        started = time.monotonic()
        deadline = started + patience_s
        failures = 0
        while True:
            try:
                conn = await self._pool.acquire(timeout=max(deadline - time.monotonic(), 0.01))
                break
            except BUSY_ERRORS as exc:
                self.refused += 1
                self._full_server.refused()
                self._log_busy(exc)
                failures += 1
                delay = BUSY_RETRY.delay(failures)
                if time.monotonic() + delay >= deadline:
                    raise
                await anyio.sleep(BUSY_RETRY.jittered(delay))
        waited_ms = (time.monotonic() - started) * 1000
        self.acquired += 1
        if waited_ms > WAITED_MS:
            self.waited += 1
        self.worst_wait_ms.record(waited_ms)
        try:
            if self._pooler == "pgbouncer":
                async with conn.transaction():
                    await conn.execute(SET_LOCAL_TIMEOUTS)
                    yield conn
            else:
                yield conn
        finally:
            if self._full_server.recently():
                # Closed at release (asyncpg closes a connection of an older generation);
                # the next call connects afresh.
                await self._pool.expire_connections()
            await self._pool.release(conn)

    def _log_busy(self, exc: BaseException) -> None:
        """One warning per pool every BUSY_LOG_EVERY_S, never a traceback: a full server is
        a passing condition, and forty gateways retrying must not flood the logs."""
        now = time.monotonic()
        if now - self._last_busy_log < BUSY_LOG_EVERY_S:
            return
        self._last_busy_log = now
        log.warning("postgres server refused a connection (it is full or starting); waiting "
                    "and retrying", action="pool_wait", pool=self.name,
                    error=type(exc).__name__, refused=self.refused)

    def in_transaction_per_call(self) -> bool:
        """Whether every connection() body already runs inside a transaction (PgBouncer)."""
        return self._pooler == "pgbouncer"

    def stats(self) -> dict[str, Any]:
        """Size and waits, for `gateway_status` and `doctor`."""
        worst = self.worst_wait_ms.worst()
        return {"size": self._pool.get_size(), "idle": self._pool.get_idle_size(),
                "max": self._pool.get_max_size(), "acquired": self.acquired,
                "waited": self.waited, "refused_connects": self.refused,
                "worst_wait_ms_1h": round(worst, 1) if worst is not None else None}

    async def close(self) -> None:
        try:
            with anyio.fail_after(CLOSE_TIMEOUT_S):
                await self._pool.close()
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("postgres pool did not close cleanly; terminating",
                        action="close_store", pool=self.name, error=type(exc).__name__)
            self._pool.terminate()

    def terminate(self) -> None:
        self._pool.terminate()
