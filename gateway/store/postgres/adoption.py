"""The PostgreSQL store's detach, adoption and re-queue methods (the JobRows role's, in
gateway/store/base.py): EXTEND_LEASES, LIST_ADOPTION_CANDIDATES, ADOPT_JOB and REQUEUE_JOB
(sql.py states each one's invariant), each one statement on a connection of the store's.

PostgresJobStore composes this mixin (roles.py names what it uses of the store).
"""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg

from gateway.model import InstanceRow, JobRow
from gateway.store.base import AdoptionCandidate, TakeOver
from gateway.store.owner_columns import owner_fields
from gateway.store.postgres.pool import WORK_PATIENCE_S
from gateway.store.postgres.roles import PostgresRole
from gateway.store.postgres.rows import _job, _status_count
from gateway.store.postgres.sql import (
    ADOPT_JOB,
    EXTEND_LEASES,
    LIST_ADOPTION_CANDIDATES,
    REQUEUE_JOB,
)


class PostgresAdoption(PostgresRole):
    """Detach, adoption and re-queue of PostgresJobStore."""

    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        if not seconds:
            return 0
        ids = list(seconds)
        async with self._connection("extend leases", patience_s=WORK_PATIENCE_S) as conn:
            return _status_count(await conn.execute(
                EXTEND_LEASES, instance_id, ids, [float(seconds[i]) for i in ids]))

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        async with self._connection("list adoption candidates") as conn:
            rows = await conn.fetch(LIST_ADOPTION_CANDIDATES, instance_id, hostname, boot_id,
                                    max(limit, 0))
        return [_candidate(row) for row in rows]

    async def _take_over(self, action: str, sql: str, take: TakeOver,
                         *extra: object) -> JobRow | None:
        async with self._connection(action) as conn:
            row = await conn.fetchrow(sql, take.job_id, take.expected_owner,
                                      take.expected_status.value, take.instance_id,
                                      take.hostname, take.boot_id, float(take.ttl_s), *extra)
        return _job(row) if row is not None else None

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("adopt job", ADOPT_JOB, take)

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("requeue job", REQUEUE_JOB, take, take.requeue_reasons)


def _candidate(row: asyncpg.Record) -> AdoptionCandidate:
    owner = owner_fields(row)
    return AdoptionCandidate(job=_job(row), owner=None if owner is None else InstanceRow(**owner))
