"""The PostgreSQL store's WorkerQueue role (gateway/store/protocol_roles.py): its JobStore methods.

PostgresJobStore composes this mixin; the SQL is workers.py's (RETURN_TO_POOL as sql.py
completes it), the connections and transactions the store's (roles.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gateway.model import InstanceRow, JobRow
from gateway.store.postgres import workers as postgres_workers
from gateway.store.postgres.pool import WORK_PATIENCE_S
from gateway.store.postgres.roles import PostgresRole
from gateway.store.postgres.rows import _status_count
from gateway.store.postgres.sql import RETURN_TO_POOL
from gateway.store.protocol_roles import RemotePatch, WorkerClaim


class PostgresWorkerQueue(PostgresRole):
    """Worker hosts (issue 42, workers.py) of PostgresJobStore."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        async with self._connection("publish capabilities", lease=True) as conn:
            status = await conn.execute(postgres_workers.PUBLISH_CAPABILITIES, instance_id,
                                        capabilities)
        return _status_count(status) == 1

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        async with self._transaction("claim jobs", patience_s=WORK_PATIENCE_S) as conn:
            return await postgres_workers.claim_jobs(conn, claim, limit)

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        if not job_ids:
            return []
        async with self._connection("return jobs to the pool") as conn:
            rows = await conn.fetch(RETURN_TO_POOL, taker.instance_id, taker.hostname,
                                    taker.boot_id, float(ttl_s), float(http_grace_s),
                                    list(job_ids))
        return [row["id"] for row in rows]

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        if not reasons:
            return 0
        ids = list(reasons)
        async with self._connection("set unschedulable") as conn:
            return _status_count(await conn.execute(
                postgres_workers.SET_UNSCHEDULABLE, owner_instance, ids,
                [reasons[i] for i in ids]))

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        async with self._connection("fail unscheduled jobs") as conn:
            rows = await conn.fetch(postgres_workers.FAIL_UNSCHEDULED, owner_instance,
                                    float(queue_timeout_s), error)
        return [row["id"] for row in rows]

    async def record_worktree_plan(self, job_id: str, owner_instance: str,
                                   request_json: str) -> bool:
        async with self._connection("record worktree plan") as conn:
            return _status_count(await conn.execute(
                postgres_workers.RECORD_WORKTREE_PLAN, job_id, owner_instance,
                request_json)) == 1

    async def put_patch(self, patch: RemotePatch) -> bool:
        async with self._connection("put patch") as conn:
            return _status_count(await conn.execute(
                postgres_workers.PUT_PATCH, patch.job_id, patch.hostname, patch.base_sha,
                patch.tip, patch.size, patch.patch)) == 1

    async def get_patch(self, job_id: str) -> RemotePatch | None:
        async with self._connection("get patch") as conn:
            row = await conn.fetchrow(postgres_workers.GET_PATCH, job_id)
        if row is None:
            return None
        return RemotePatch(job_id=row["job_id"], hostname=row["hostname"],
                           base_sha=row["base_sha"], tip=row["tip"], size=int(row["size"]),
                           patch=None if row["patch"] is None else bytes(row["patch"]),
                           discard_requested=bool(row["discard_requested"]))

    async def request_worktree_removal(self, job_id: str) -> bool:
        async with self._connection("request worktree removal") as conn:
            return _status_count(await conn.execute(
                postgres_workers.REQUEST_REMOVAL, job_id)) == 1

    async def worktree_removals(self, hostname: str) -> list[str]:
        async with self._connection("worktree removals") as conn:
            rows = await conn.fetch(postgres_workers.WORKTREE_REMOVALS, hostname)
        return [row["job_id"] for row in rows]

    async def worktree_removed(self, job_id: str) -> bool:
        async with self._connection("worktree removed") as conn:
            return _status_count(await conn.execute(
                postgres_workers.WORKTREE_REMOVED, job_id)) == 1
