"""What the role mixins of PostgresJobStore (adoption.py, worker_queue.py,
attempt_groups.py, notice_outbox.py) use of the store: declared once here, for the type
checker.

Each mixin runs its statements on a connection from the store's `_connection` or inside its
`_transaction` (store.py): the same pools, patience and error translation (a failure to
reach the server becomes StoreUnavailable without the DSN's password) as every other call of
the store. The store defines both; nothing here exists at run time.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import asyncpg

from gateway.store.postgres.pool import READ_PATIENCE_S


class PostgresRole:
    """The base of each role mixin: the store's pooled connections and transactions."""

    if TYPE_CHECKING:
        def _connection(self, action: str, *, lease: bool = False,
                        patience_s: float | None = None,
                        ) -> AbstractAsyncContextManager[asyncpg.Connection]: ...

        def _transaction(self, action: str, *, patience_s: float = READ_PATIENCE_S,
                         ) -> AbstractAsyncContextManager[asyncpg.Connection]: ...
