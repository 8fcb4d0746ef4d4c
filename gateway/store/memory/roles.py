"""What the role mixins of MemoryJobStore (adoption.py, worker_queue.py, attempt_groups.py,
notice_outbox.py) use of the store: its state and its clock, declared once here for the type
checker.

The store (store.py) creates the state; each mixin method takes the store's one lock for its
whole body, like every method of the store, so each call is atomic like one SQL transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from gateway.model import InstanceRow, JobRow, NewJob
from gateway.store.memory.attempts import MemoryAttempts
from gateway.store.memory.outbox import MemoryOutbox
from gateway.store.memory.usage import MemoryLedger


class MemoryRole:
    """The base of each role mixin: the state MemoryJobStore holds, and its clock."""

    clock: Callable[[], float]
    _jobs: dict[str, JobRow]
    _instances: dict[str, InstanceRow]
    _ledger: MemoryLedger
    _outbox: MemoryOutbox
    _groups: MemoryAttempts
    _lock: anyio.Lock

    if TYPE_CHECKING:
        def _now(self) -> datetime: ...

        def _insert_job(self, job: NewJob, ttl_s: float) -> JobRow: ...
