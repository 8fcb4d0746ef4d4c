"""The SQLite store's WorkerQueue role (gateway/store/protocol_roles.py): its JobStore methods.

One host has no remote jobs (admission refuses them), so the rest of the role is
NoRemoteJobs (store/one_host.py); only the capabilities are published, on the instance row.
"""

from __future__ import annotations

from gateway.store.one_host import NoRemoteJobs
from gateway.store.sqlite.roles import SqliteRole
from gateway.store.sqlite.rows import _changed
from gateway.store.sqlite.sql import PUBLISH_CAPABILITIES


class SqliteWorkerQueue(NoRemoteJobs, SqliteRole):
    """Worker hosts (issue 42) of SqliteJobStore."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        params = {"instance_id": instance_id, "capabilities": capabilities}
        return await self._transaction("publish_capabilities", lambda db, now: _changed(
            db, PUBLISH_CAPABILITIES, params)) == 1
