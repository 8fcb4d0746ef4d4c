"""The memory store's NoticeOutbox role (gateway/store/protocol_roles.py): its JobStore methods.

MemoryJobStore composes this mixin; each method takes the store's one lock (roles.py) and
hands the rules to MemoryOutbox (outbox.py), which holds the notices.
"""

from __future__ import annotations

from gateway.store.memory.roles import MemoryRole
from gateway.store.outbox import CLAIM_BATCH, NOTICE_LIST_LIMIT, Notice, Settlement


class MemoryNoticeOutbox(MemoryRole):
    """The completion-notice outbox (store/outbox.py) of MemoryJobStore."""

    async def claim_notices(self, instance_id: str, lease_s: float,
                            limit: int = CLAIM_BATCH) -> list[Notice]:
        async with self._lock:
            return self._outbox.claim(instance_id, lease_s, limit, self._now())

    async def record_notice_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        async with self._lock:
            return self._outbox.record_sink(notice_id, instance_id, sink)

    async def settle_notice(self, notice_id: str, instance_id: str, outcome: Settlement,
                            retry_in_s: float = 0.0, error: str | None = None) -> bool:
        async with self._lock:
            return self._outbox.settle(notice_id, instance_id, outcome, retry_in_s, error,
                                       self._now())

    async def list_notices(self, *, failed_only: bool = False,
                           limit: int = NOTICE_LIST_LIMIT) -> list[Notice]:
        async with self._lock:
            return self._outbox.listed(failed_only, limit)

    async def count_failed_notices(self) -> int:
        async with self._lock:
            return self._outbox.count_failed()
