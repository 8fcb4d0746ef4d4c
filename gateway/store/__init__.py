"""Job stores: pick the backend named in `[persistence]` and open it (docs/configuration.md)."""

from __future__ import annotations

from typing import assert_never

from gateway.config import Settings
from gateway.store.base import DuplicateActiveJob, JobStore, StoreUnavailable

__all__ = ["DuplicateActiveJob", "JobStore", "StoreUnavailable", "open_store"]

# asyncpg is the `postgres` extra: a SQLite install does not carry it.
POSTGRES_DRIVER_MISSING = (
    'persistence.backend = "postgres" needs the asyncpg driver, which this installation does '
    "not have. Install the extra: `uvx --from 'agent-cli-gateway[postgres]' agent-cli-gateway` "
    "(in an MCP client's config: args = [\"--from\", \"agent-cli-gateway[postgres]\", "
    "\"agent-cli-gateway\"]), `pip install 'agent-cli-gateway[postgres]'`, or from a checkout "
    "`uv sync --extra postgres`.")


async def open_store(settings: Settings, role: str = "stdio") -> JobStore:
    """Build the configured backend, connect it and migrate its schema. `role` ("stdio",
    "http", a CLI command) sizes a PostgreSQL pool (`[persistence] pool_max`).

    PostgreSQL's module (and asyncpg) is imported only when it is the chosen backend, so a
    SQLite user never pays for it. Raises StoreUnavailable when the store cannot be opened.
    """
    persistence = settings.persistence
    store: JobStore
    if persistence.backend == "memory":
        from gateway.store.memory.store import MemoryJobStore  # deferred: start-up

        store = MemoryJobStore()
    elif persistence.backend == "sqlite":
        from gateway.store.sqlite.store import SqliteJobStore  # deferred: start-up

        store = SqliteJobStore(persistence.path)
    elif persistence.backend == "postgres":
        try:
            from gateway.store.postgres.store import PostgresJobStore  # deferred: optional dependency
        except ImportError as exc:
            if exc.name != "asyncpg":
                raise
            raise StoreUnavailable(POSTGRES_DRIVER_MISSING, permanent=True) from None

        if not persistence.dsn:  # load_settings refuses this; Settings built by hand may not
            raise StoreUnavailable("persistence.dsn is required for the postgres backend")
        store = PostgresJobStore(persistence.dsn, max_size=persistence.pool_max_for(role),
                                 pooler=persistence.pooler)
    else:
        assert_never(persistence.backend)  # the checker proves every backend is handled
    await store.open()
    return store
