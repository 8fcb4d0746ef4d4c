"""What the role mixins of SqliteJobStore (adoption.py, worker_queue.py, attempt_groups.py,
notice_outbox.py) use of the store: declared once here, for the type checker.

Each mixin runs its SQL through the store's `_read` or `_transaction` (store.py), so every
write is one `BEGIN IMMEDIATE` transaction on the one connection, like every other write of
the store. The store defines both; nothing here exists at run time but the clock's name.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypeVar

import aiosqlite

T = TypeVar("T")


class SqliteRole:
    """The base of each role mixin: the store's clock, reads and write transactions."""

    clock: Callable[[], float]

    if TYPE_CHECKING:
        def _read(self, action: str) -> AbstractAsyncContextManager[aiosqlite.Connection]: ...

        async def _transaction(self, action: str,
                               work: Callable[[sqlite3.Connection, float], T]) -> T: ...
