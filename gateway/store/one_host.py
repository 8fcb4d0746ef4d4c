"""The WorkerQueue methods of a store only one host uses (SQLite, memory): no remote jobs.

Admission refuses `runs_on` other than "here" on these stores, so no job of another host is
ever in them: there is nothing to claim, return to the pool, mark unschedulable or fail, and
no patch or worktree removal of another host to keep. Each wing publishes capabilities
itself (it keeps them on its instance row) and takes the rest from here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gateway.model import InstanceRow, JobRow
from gateway.store.protocol_roles import RemotePatch, WorkerClaim


class NoRemoteJobs:
    """The empty answers of a one-host store to the worker queue (see the module)."""

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        return []

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        return []

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        return 0

    async def record_worktree_plan(self, job_id: str, owner_instance: str,
                                   request_json: str) -> bool:
        return False

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
