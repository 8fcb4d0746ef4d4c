"""Reading a PostgreSQL store without changing it: `doctor` and the CLI's reading commands.

Moved out of the executor (`store.py`) whole: one connection of its own, a read-only transaction, no
pool, nothing created or migrated (gateway/store/inspect.py says why).
"""

from __future__ import annotations

from contextlib import suppress

import asyncpg

from gateway.store.base import StoreUnavailable
from gateway.store.postgres.errors import _UNAVAILABLE_ERRORS, secrets_of, unavailable_error
from gateway.store.postgres.pool import APPLICATION_NAME, CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, Pooler
from gateway.store.postgres.sql import (
    HAS_SCHEMA_VERSION_TABLE,
    READ_CONNECTION_USAGE,
    READ_SCHEMA_VERSION,
)


async def read_schema_version(dsn: str, pooler: Pooler = "none",
                              ) -> tuple[int | None, dict[str, int]]:
    """The database's schema version (None when no gateway has created one) and how many
    server connections the gateways hold of how many (`doctor`: is the budget near the
    server's max_connections?), read in a read-only transaction that creates nothing
    (gateway/store/inspect.py: doctor and the CLI's reading commands must never create or
    migrate a shared schema). Behind PgBouncer no startup parameter but application_name,
    and no named prepared statement; the counts are then of PgBouncer's server side.

    Raises StoreUnavailable (its text free of the DSN's password)."""
    secrets = secrets_of(dsn)

    def unavailable(action: str, exc: BaseException) -> StoreUnavailable:
        return unavailable_error(action, exc, secrets)

    try:
        conn = await asyncpg.connect(
            dsn, timeout=CONNECT_TIMEOUT_S, statement_cache_size=0,
            server_settings={"application_name": APPLICATION_NAME})
    except (*_UNAVAILABLE_ERRORS, ValueError, asyncpg.ClientConfigurationError) as exc:
        raise unavailable("connect", exc) from None
    try:
        async with conn.transaction(readonly=True):
            usage = await conn.fetchrow(READ_CONNECTION_USAGE, APPLICATION_NAME)
            connections = {key: int(value) for key, value in usage.items()}
            if not await conn.fetchval(HAS_SCHEMA_VERSION_TABLE):
                return None, connections
            return int(await conn.fetchval(READ_SCHEMA_VERSION)), connections
    except (*_UNAVAILABLE_ERRORS, asyncpg.PostgresError) as exc:
        raise unavailable("read-only inspection", exc) from None
    finally:
        with suppress(*_UNAVAILABLE_ERRORS):
            await conn.close(timeout=CLOSE_TIMEOUT_S)
