"""The memory store's WorkerQueue role (gateway/store/protocol_roles.py): its JobStore methods.

One process has no remote jobs (admission refuses them), so the rest of the role is
NoRemoteJobs (store/one_host.py); only the capabilities are kept, on the instance row.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.store.memory.roles import MemoryRole
from gateway.store.one_host import NoRemoteJobs


class MemoryWorkerQueue(NoRemoteJobs, MemoryRole):
    """Worker hosts (issue 42) of MemoryJobStore."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        async with self._lock:
            row = self._instances.get(instance_id)
            if row is None:
                return False
            self._instances[instance_id] = replace(row, capabilities=capabilities)
            return True
