"""The SQLite store's AttemptGroups role (gateway/store/protocol_roles.py): its JobStore methods.

SqliteJobStore composes this mixin; the SQL and the work on the connection's thread are
attempts.py's, the transactions the store's (roles.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.model import NewJob
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.sqlite import attempts as sqlite_attempts
from gateway.store.sqlite.roles import SqliteRole
from gateway.store.sqlite.rows import _insert_job


class SqliteAttemptGroups(SqliteRole):
    """Attempt groups (issue 39) of SqliteJobStore."""

    async def insert_attempt_group(self, group: NewAttemptGroup, jobs: Sequence[NewJob],
                                   ttl_s: float) -> AttemptGroupRow:
        def admit(db: sqlite3.Connection, now: float) -> AttemptGroupRow:
            # Invariant: the group, its N jobs and their reservations commit together or
            # not at all: any refusal below raises, and _transaction rolls everything back.
            row = sqlite_attempts.insert_group(db, group, [job.id for job in jobs], now)
            for job in jobs:
                _insert_job(db, job, ttl_s, now)
            return row

        return await self._transaction("insert_attempt_group", admit)

    async def find_attempt_group(self, dedup_key: str,
                                 dedup_window_s: float) -> AttemptGroupRow | None:
        async with self._read("find_attempt_group") as conn:
            rows = list(await conn.execute_fetchall(sqlite_attempts.FIND_GROUP, {
                "dedup_key": dedup_key, "now": self.clock(), "window_s": dedup_window_s}))
        return sqlite_attempts.group_row(rows[0]) if rows else None

    async def get_attempt_group(self, group_id: str) -> AttemptGroupRow | None:
        async with self._read("get_attempt_group") as conn:
            rows = list(await conn.execute_fetchall(sqlite_attempts.GET_GROUP, (group_id,)))
        return sqlite_attempts.group_row(rows[0]) if rows else None

    async def list_attempt_groups(self, *, principal: str | None = None,
                                  status: GroupStatus | None = None,
                                  limit: int = 50) -> list[AttemptGroupRow]:
        async with self._read("list_attempt_groups") as conn:
            rows = await conn.execute_fetchall(sqlite_attempts.LIST_GROUPS, {
                "principal": principal, "limit": limit,
                "status": None if status is None else status.value})
        return [sqlite_attempts.group_row(row) for row in rows]

    async def list_attempts(self, group_id: str) -> list[AttemptRow]:
        async with self._read("list_attempts") as conn:
            rows = await conn.execute_fetchall(sqlite_attempts.LIST_ATTEMPTS, (group_id,))
        return [sqlite_attempts.attempt_row(row) for row in rows]

    async def get_attempt(self, job_id: str) -> AttemptRow | None:
        async with self._read("get_attempt") as conn:
            rows = list(await conn.execute_fetchall(sqlite_attempts.GET_ATTEMPT, (job_id,)))
        return sqlite_attempts.attempt_row(rows[0]) if rows else None

    async def claim_check(self, job_id: str, claimer: str) -> bool:
        return await self._transaction("claim_check", lambda db, now: (
            sqlite_attempts.claim_check(db, job_id, claimer, now)))

    async def skip_check(self, job_id: str, reason: str) -> bool:
        return await self._transaction("skip_check", lambda db, now: (
            sqlite_attempts.skip_check(db, job_id, reason, now)))

    async def record_check(self, job_id: str, result: CheckResult) -> bool:
        return await self._transaction("record_check", lambda db, now: (
            sqlite_attempts.record_check(db, job_id, result, now)))

    async def end_attempt_group(self, end: GroupEnd) -> bool:
        return await self._transaction("end_attempt_group", lambda db, now: (
            sqlite_attempts.end_group(db, end, now)))
