"""The PostgreSQL store's NoticeOutbox role (gateway/store/protocol_roles.py): its JobStore methods.

PostgresJobStore composes this mixin; the SQL is outbox.py's, the connections and
transactions the store's (roles.py).
"""

from __future__ import annotations

from gateway.store.outbox import CLAIM_BATCH, NOTICE_LIST_LIMIT, Notice, Settlement
from gateway.store.postgres import outbox as postgres_outbox
from gateway.store.postgres.roles import PostgresRole


class PostgresNoticeOutbox(PostgresRole):
    """The completion-notice outbox (store/outbox.py) of PostgresJobStore."""

    async def claim_notices(self, instance_id: str, lease_s: float,
                            limit: int = CLAIM_BATCH) -> list[Notice]:
        async with self._transaction("claim notices") as conn:
            return await postgres_outbox.claim(conn, instance_id, lease_s, limit)

    async def record_notice_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        async with self._connection("record notice sink") as conn:
            return await postgres_outbox.record_sink(conn, notice_id, instance_id, sink)

    async def settle_notice(self, notice_id: str, instance_id: str, outcome: Settlement,
                            retry_in_s: float = 0.0, error: str | None = None) -> bool:
        async with self._connection("settle notice") as conn:
            return await postgres_outbox.settle(conn, notice_id, instance_id, outcome,
                                                retry_in_s, error)

    async def list_notices(self, *, failed_only: bool = False,
                           limit: int = NOTICE_LIST_LIMIT) -> list[Notice]:
        async with self._connection("list notices") as conn:
            return await postgres_outbox.list_notices(conn, failed_only, limit)

    async def count_failed_notices(self) -> int:
        async with self._connection("count failed notices") as conn:
            return await postgres_outbox.count_failed(conn)
