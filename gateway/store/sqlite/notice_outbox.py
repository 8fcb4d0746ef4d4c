"""The SQLite store's NoticeOutbox role (gateway/store/protocol_roles.py): its JobStore methods.

SqliteJobStore composes this mixin; the SQL and the work on the connection's thread are
outbox.py's, the transactions the store's (roles.py).
"""

from __future__ import annotations

from gateway.store.outbox import CLAIM_BATCH, NOTICE_LIST_LIMIT, Notice, Settlement
from gateway.store.sqlite import outbox as sqlite_outbox
from gateway.store.sqlite.aiosqlite_fence import on_connection_thread
from gateway.store.sqlite.roles import SqliteRole


class SqliteNoticeOutbox(SqliteRole):
    """The completion-notice outbox (store/outbox.py) of SqliteJobStore."""

    async def claim_notices(self, instance_id: str, lease_s: float,
                            limit: int = CLAIM_BATCH) -> list[Notice]:
        return await self._transaction("claim_notices", lambda db, now: sqlite_outbox.claim(
            db, instance_id, lease_s, limit, now))

    async def record_notice_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        return await self._transaction("record_notice_sink", lambda db, now: (
            sqlite_outbox.record_sink(db, notice_id, instance_id, sink)))

    async def settle_notice(self, notice_id: str, instance_id: str, outcome: Settlement,
                            retry_in_s: float = 0.0, error: str | None = None) -> bool:
        return await self._transaction("settle_notice", lambda db, now: sqlite_outbox.settle(
            db, notice_id, instance_id, outcome, retry_in_s, error, now))

    async def list_notices(self, *, failed_only: bool = False,
                           limit: int = NOTICE_LIST_LIMIT) -> list[Notice]:
        async with self._read("list_notices") as conn:
            return await on_connection_thread(
                conn, lambda db: sqlite_outbox.list_notices(db, failed_only, limit))

    async def count_failed_notices(self) -> int:
        async with self._read("count_failed_notices") as conn:
            return await on_connection_thread(conn, sqlite_outbox.count_failed)
