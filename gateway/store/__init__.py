"""Job stores: pick the backend named in `[persistence]` and open it (DESIGN.md section 7)."""

from __future__ import annotations

from typing import assert_never

from gateway.config import Settings
from gateway.store.base import DuplicateActiveJob, JobStore, StoreUnavailable

__all__ = ["DuplicateActiveJob", "JobStore", "StoreUnavailable", "open_store"]


async def open_store(settings: Settings) -> JobStore:
    """Build the configured backend, connect it and migrate its schema.

    PostgreSQL's module (and asyncpg) is imported only when it is the chosen backend, so a
    SQLite user never pays for it. Raises StoreUnavailable when the store cannot be opened.
    """
    persistence = settings.persistence
    store: JobStore
    if persistence.backend == "memory":
        from gateway.store.memory import MemoryJobStore

        store = MemoryJobStore()
    elif persistence.backend == "sqlite":
        from gateway.store.sqlite import SqliteJobStore

        store = SqliteJobStore(persistence.path)
    elif persistence.backend == "postgres":
        from gateway.store.postgres import PostgresJobStore

        if not persistence.dsn:  # load_settings refuses this; Settings built by hand may not
            raise StoreUnavailable("persistence.dsn is required for the postgres backend")
        store = PostgresJobStore(persistence.dsn)
    else:
        assert_never(persistence.backend)  # the checker proves every backend is handled
    await store.open()
    return store
