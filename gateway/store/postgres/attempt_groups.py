"""The PostgreSQL store's AttemptGroups role (gateway/store/protocol_roles.py): its JobStore methods.

PostgresJobStore composes this mixin; the SQL is attempts.py's, the connections and
transactions the store's (roles.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from gateway.model import NewJob
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    DuplicateActiveGroup,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.postgres import attempts as postgres_attempts
from gateway.store.postgres.pool import WORK_PATIENCE_S
from gateway.store.postgres.roles import PostgresRole
from gateway.store.postgres.rows import _insert_job, _savepoint, _status_count


class PostgresAttemptGroups(PostgresRole):
    """Attempt groups (issue 39) of PostgresJobStore."""

    async def insert_attempt_group(self, group: NewAttemptGroup, jobs: Sequence[NewJob],
                                   ttl_s: float) -> AttemptGroupRow:
        # Invariant: the group, its N jobs and their reservations commit together or not
        # at all: any refusal below raises out of the transaction, which rolls back.
        async with self._transaction("insert attempt group") as conn:
            try:
                async with _savepoint(conn):
                    row = await postgres_attempts.insert_group(
                        conn, group, [job.id for job in jobs])
            except asyncpg.UniqueViolationError as exc:
                if not postgres_attempts.duplicate(exc):
                    raise ValueError(f"group id {group.group_id} already exists") from None
                raise DuplicateActiveGroup(
                    await postgres_attempts.running_group_id(conn, group.dedup_key)) from None
            for job in jobs:
                await _insert_job(conn, job, ttl_s)
            return row

    async def find_attempt_group(self, dedup_key: str,
                                 dedup_window_s: float) -> AttemptGroupRow | None:
        async with self._connection("find attempt group") as conn:
            row = await conn.fetchrow(postgres_attempts.FIND_GROUP, dedup_key,
                                      float(dedup_window_s))
        return postgres_attempts.group_row(row) if row is not None else None

    async def get_attempt_group(self, group_id: str) -> AttemptGroupRow | None:
        async with self._connection("get attempt group") as conn:
            row = await conn.fetchrow(postgres_attempts.GET_GROUP, group_id)
        return postgres_attempts.group_row(row) if row is not None else None

    async def list_attempt_groups(self, *, principal: str | None = None,
                                  status: GroupStatus | None = None,
                                  limit: int = 50) -> list[AttemptGroupRow]:
        async with self._connection("list attempt groups") as conn:
            rows = await conn.fetch(postgres_attempts.LIST_GROUPS, principal, limit,
                                    None if status is None else status.value)
        return [postgres_attempts.group_row(row) for row in rows]

    async def list_attempts(self, group_id: str) -> list[AttemptRow]:
        async with self._connection("list attempts") as conn:
            rows = await conn.fetch(postgres_attempts.LIST_ATTEMPTS, group_id)
        return [postgres_attempts.attempt_row(row) for row in rows]

    async def get_attempt(self, job_id: str) -> AttemptRow | None:
        async with self._connection("get attempt") as conn:
            row = await conn.fetchrow(postgres_attempts.GET_ATTEMPT, job_id)
        return postgres_attempts.attempt_row(row) if row is not None else None

    async def claim_check(self, job_id: str, claimer: str) -> bool:
        async with self._connection("claim check", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(postgres_attempts.CLAIM_CHECK, job_id, claimer)
        return _status_count(status) == 1

    async def skip_check(self, job_id: str, reason: str) -> bool:
        async with self._connection("skip check", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(postgres_attempts.SKIP_CHECK, job_id, reason)
        return _status_count(status) == 1

    async def record_check(self, job_id: str, result: CheckResult) -> bool:
        async with self._connection("record check", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(postgres_attempts.RECORD_CHECK,
                                        *postgres_attempts.record_args(job_id, result))
        return _status_count(status) == 1

    async def end_attempt_group(self, end: GroupEnd) -> bool:
        async with self._connection("end attempt group", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(postgres_attempts.END_GROUP,
                                        *postgres_attempts.end_args(end))
        return _status_count(status) == 1
