"""The memory store's WorkerQueue role (gateway/store/protocol_roles.py): its JobStore methods.

One process has no remote jobs (admission refuses them), so there is nothing to claim,
return or fail; only the capabilities are kept, on the instance row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from gateway.model import InstanceRow, JobRow
from gateway.store.memory.roles import MemoryRole
from gateway.store.protocol_roles import RemotePatch, WorkerClaim


class MemoryWorkerQueue(MemoryRole):
    """Worker hosts (issue 42) of MemoryJobStore."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        async with self._lock:
            row = self._instances.get(instance_id)
            if row is None:
                return False
            self._instances[instance_id] = replace(row, capabilities=capabilities)
            return True

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
