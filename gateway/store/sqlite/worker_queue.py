"""The SQLite store's WorkerQueue role (gateway/store/protocol_roles.py): its JobStore methods.

One host has no remote jobs (admission refuses them), so there is nothing to claim, return
or fail; only the capabilities are published, on the instance row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gateway.model import InstanceRow, JobRow
from gateway.store.protocol_roles import RemotePatch, WorkerClaim
from gateway.store.sqlite.roles import SqliteRole
from gateway.store.sqlite.rows import _changed
from gateway.store.sqlite.sql import PUBLISH_CAPABILITIES


class SqliteWorkerQueue(SqliteRole):
    """Worker hosts (issue 42) of SqliteJobStore."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        params = {"instance_id": instance_id, "capabilities": capabilities}
        return await self._transaction("publish_capabilities", lambda db, now: _changed(
            db, PUBLISH_CAPABILITIES, params)) == 1

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        return []

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        return []

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        return 0

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        return []

    async def put_patch(self, patch: RemotePatch) -> bool:
        return False

    async def get_patch(self, job_id: str) -> RemotePatch | None:
        return None

    async def request_worktree_removal(self, job_id: str) -> bool:
        return False

    async def worktree_removals(self, hostname: str) -> list[str]:
        return []

    async def worktree_removed(self, job_id: str) -> bool:
        return False
