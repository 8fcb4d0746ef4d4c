"""The PostgreSQL backend's rows and one admission's writes, shared by the executor
(store.py) and its role mixins (worker_queue.py, attempt_groups.py, notice_outbox.py).

Moved out of the executor whole: a job row from a record, the rows a command tag says it
changed, the savepoint around a statement whose failure the caller handles, and the writes
of one admission (a job and its budget reservations), which insert_job and each job of
insert_attempt_group run.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, nullcontext

import asyncpg

from gateway.model import JobRow, NewJob
from gateway.store.base import DuplicateActiveJob
from gateway.store.postgres import usage as postgres_usage
from gateway.store.postgres.sql import ACTIVE_INDEX_NAME, FIND_ACTIVE_BY_KEY, INSERT_JOB


def _status_count(status: str) -> int:
    """Rows affected, from a command tag such as `UPDATE 3` or `DELETE 0`."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


def _savepoint(conn: asyncpg.Connection) -> AbstractAsyncContextManager[object]:
    """Around a statement whose failure the caller handles by running another: inside a
    transaction (always, behind PgBouncer) a savepoint, so the failure does not abort the
    rest; outside one, nothing (the statement is its own transaction)."""
    return conn.transaction() if conn.is_in_transaction() else nullcontext()


async def _insert_job(conn: asyncpg.Connection, job: NewJob, ttl_s: float) -> JobRow:
    """One admission's writes on `conn` (insert_job; each job of insert_attempt_group)."""
    # Invariant: the job and its budget reservations commit together or not at all
    # (BudgetExceeded rolls the insert back): postgres_usage.RESERVE_BUDGET.
    try:
        async with _savepoint(conn):
            row = await conn.fetchrow(
                INSERT_JOB,
                job.id, job.provider, job.request_key, job.transport,
                job.correlation_id, job.owner_instance, float(ttl_s), job.hostname,
                job.working_dir, job.model, job.session_id, job.request_json,
                job.forced, job.boot_id, job.principal, job.running, job.runs_on,
            )
            await postgres_usage.reserve(conn, job.id, job.reservations)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name != ACTIVE_INDEX_NAME:
            raise ValueError(f"job id {job.id} already exists") from None
        existing = await conn.fetchval(FIND_ACTIVE_BY_KEY, job.request_key)
        raise DuplicateActiveJob(existing) from None
    assert row is not None  # INSERT ... RETURNING always returns the row it inserted
    return _job(row)


def _job(row: asyncpg.Record) -> JobRow:
    return JobRow.from_mapping(row)
