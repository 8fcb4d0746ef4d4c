"""The SQLite store's detach, adoption and re-queue methods (the JobRows role's, in
gateway/store/base.py): EXTEND_LEASES, LIST_ADOPTION_CANDIDATES, ADOPT_JOB and REQUEUE_JOB
(sql.py states each one's invariant), run through the store's `_read` and `_transaction`.

SqliteJobStore composes this mixin (roles.py names what it uses of the store).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping

from gateway.model import JobRow
from gateway.store.base import AdoptionCandidate, TakeOver
from gateway.store.sqlite.roles import SqliteRole
from gateway.store.sqlite.rows import _candidate, _changed, _job
from gateway.store.sqlite.sql import (
    ADOPT_JOB,
    EXTEND_LEASES,
    LIST_ADOPTION_CANDIDATES,
    REQUEUE_JOB,
)


class SqliteAdoption(SqliteRole):
    """Detach, adoption and re-queue of SqliteJobStore."""

    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        if not seconds:
            return 0
        params = {"instance_id": instance_id, "seconds": json.dumps(dict(seconds))}
        return await self._transaction("extend_leases", lambda db, now: _changed(
            db, EXTEND_LEASES, {**params, "now": now}))

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        params = {"instance_id": instance_id, "hostname": hostname, "boot_id": boot_id,
                  "orphaned_within_s": orphaned_within_s, "limit": max(limit, 0),
                  "now": time.time()}
        async with self._read("list_adoption_candidates") as conn:
            rows = await conn.execute_fetchall(LIST_ADOPTION_CANDIDATES, params)
        return [_candidate(row) for row in rows]

    async def _take_over(self, action: str, sql: str, take: TakeOver) -> JobRow | None:
        params = {"job_id": take.job_id, "expected_owner": take.expected_owner,
                  "expected_status": take.expected_status.value,
                  "instance_id": take.instance_id, "hostname": take.hostname,
                  "boot_id": take.boot_id, "ttl_s": take.ttl_s,
                  "requeue_reasons": take.requeue_reasons}

        def write(db: sqlite3.Connection, now: float) -> JobRow | None:
            row = db.execute(sql, {**params, "now": now}).fetchone()
            return _job(row) if row is not None else None

        return await self._transaction(action, write)

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("adopt_job", ADOPT_JOB, take)

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("requeue_job", REQUEUE_JOB, take)
