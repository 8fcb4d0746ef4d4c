"""Wakeups without polling on PostgreSQL (issue 29): a waiter on a job run by another
instance (`llm_job_wait`) returns when the job's row changes instead of at its next poll.

A trigger on `jobs` sends `NOTIFY agent_gateway_jobs, '<job id>'` when a row's status or
cancel request changes; each gateway that waits on a job of another instance LISTENs on one
connection of its own, outside the pools (a pooled connection goes back to the pool between
calls, and LISTEN is session state). Behind PgBouncer in transaction mode there is no
session, so there is no listener: the waiters poll as before (the NOTIFY a trigger sends
works through PgBouncer; only LISTEN does not). A listener that cannot connect, or whose
connection drops, falls back to the poll too and tries again later: a notice only ever makes
a wait shorter, never longer, so nothing depends on it being delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import structlog

from gateway.backoff import woken_or_after
from gateway.store.postgres.pool import APPLICATION_NAME, CONNECT_TIMEOUT_S

log = structlog.get_logger(__name__)

CHANNEL = "agent_gateway_jobs"
RETRY_AFTER_S = 30.0  # a listener that failed to connect is tried again this much later

# Part of a migration (sql.py names its version). Re-running it changes nothing.
NOTIFY_SCHEMA = (
    f"""CREATE OR REPLACE FUNCTION agent_gateway_notify_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', NEW.id);
    RETURN NULL;
END $$""",
    "DROP TRIGGER IF EXISTS jobs_notify ON jobs",
    """CREATE TRIGGER jobs_notify AFTER UPDATE OF status, cancel_requested_at ON jobs
FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                   OR OLD.cancel_requested_at IS DISTINCT FROM NEW.cancel_requested_at)
EXECUTE FUNCTION agent_gateway_notify_job()""",
)


class JobNotices:
    """One LISTEN connection, opened on the first wait, and the waiters per job id."""

    def __init__(self, dsn: str, *, enabled: bool) -> None:
        self._dsn = dsn
        self.enabled = enabled  # False behind a pooler: no session to LISTEN on
        self._conn: asyncpg.Connection | None = None
        self._opening: asyncio.Lock | None = None
        self._retry_at = 0.0
        self._waiters: dict[str, set[asyncio.Event]] = {}

    async def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when a notice about `job_id` arrives or after `timeout_s`, whichever is
        first; without a listener, simply after `timeout_s` (the caller's poll)."""
        if not await self._listening():
            await asyncio.sleep(timeout_s)
            return
        event = asyncio.Event()
        self._waiters.setdefault(job_id, set()).add(event)
        try:
            await woken_or_after(event, timeout_s)
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[job_id]

    async def _listening(self) -> bool:
        if not self.enabled:
            return False
        if self._conn is not None and not self._conn.is_closed():
            return True
        if time.monotonic() < self._retry_at:
            return False
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._conn is not None and not self._conn.is_closed():
                return True
            try:
                conn = await asyncpg.connect(
                    self._dsn, timeout=CONNECT_TIMEOUT_S,
                    server_settings={"application_name": f"{APPLICATION_NAME} listener"})
                await conn.add_listener(CHANNEL, self._on_notice)
            except Exception as exc:  # any failure: poll, and try again later
                self._retry_at = time.monotonic() + RETRY_AFTER_S
                log.info("job notices unavailable; waits poll", action="listen",
                         error=type(exc).__name__)
                return False
            conn.add_termination_listener(self._on_lost)
            self._conn = conn
            return True

    def _on_notice(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._waiters.get(payload, ()):
            event.set()

    def _on_lost(self, _conn: Any) -> None:
        """The listener's connection ended: wake every waiter (each re-reads its row) and
        poll until a new listener is up."""
        self._conn = None
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT_S)
