"""Read-only look at a store's schema: which version it holds, or that there is none yet.

`open_store` creates and migrates (the gateway's job at startup); `doctor` and the read-only
`jobs` commands must never do either: a newer CLI run against a shared database would
upgrade it under older gateways, which then refuse it. So this module opens nothing it
could create: SQLite is opened read-only when the file exists (`mode=ro`, never created),
PostgreSQL in a read-only session that only reads information_schema and the version table.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from gateway.config import Settings
from gateway.logs import redact_text
from gateway.store.base import SCHEMA_VERSION, StoreUnavailable

PG_CONNECT_TIMEOUT_S = 5.0  # an unreachable server is reported, not waited for
SQLITE_BUSY_TIMEOUT_S = 5.0  # a writer holding the lock briefly is waited for, not reported

_SQLITE_HAS_VERSION_TABLE = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
_SQLITE_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
_PG_HAS_VERSION_TABLE = """
SELECT EXISTS (SELECT 1 FROM information_schema.tables
               WHERE table_schema = current_schema() AND table_name = 'schema_version')"""
_PG_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a store holds. `version` None: no gateway has created the schema yet."""

    version: int | None
    exists: bool = True  # False: a SQLite file that is not there

    @property
    def current(self) -> bool:
        return self.version == SCHEMA_VERSION

    def what_serve_does(self) -> str:
        """What `serve` (or any gateway start) would do with this store, in words."""
        if self.version is None:
            return f"`serve` creates the schema (version {SCHEMA_VERSION}) at its first start"
        if self.version < SCHEMA_VERSION:
            return (f"`serve` migrates it from version {self.version} to {SCHEMA_VERSION} at "
                    f"start (older gateways sharing it must be upgraded first)")
        if self.version > SCHEMA_VERSION:
            return (f"`serve` refuses it: version {self.version} is newer than this gateway "
                    f"understands ({SCHEMA_VERSION}); upgrade agent-cli-gateway")
        return "`serve` uses it as it is"


async def inspect_schema(settings: Settings) -> SchemaState:
    """The configured store's schema state, read without writing anything.

    Raises StoreUnavailable (its message free of secrets) when the store cannot be read.
    The memory backend has no schema to read: it is reported as current.
    """
    persistence = settings.persistence
    if persistence.backend == "sqlite":
        return await asyncio.to_thread(_inspect_sqlite, persistence.path)
    if persistence.backend == "postgres":
        if not persistence.dsn:
            raise StoreUnavailable("persistence.dsn is required for the postgres backend")
        return await _inspect_postgres(persistence.dsn)
    return SchemaState(SCHEMA_VERSION)


def _inspect_sqlite(path: Path) -> SchemaState:
    if not path.exists():
        return SchemaState(None, exists=False)
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S)
        try:
            if not conn.execute(_SQLITE_HAS_VERSION_TABLE).fetchall():
                return SchemaState(None)
            return SchemaState(int(conn.execute(_SQLITE_VERSION).fetchone()[0]))
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"sqlite store: cannot read it: {exc}") from None


async def _inspect_postgres(dsn: str) -> SchemaState:
    import asyncpg

    try:
        # A read-only session: even a statement this module does not send could not write.
        conn = await asyncpg.connect(
            dsn, timeout=PG_CONNECT_TIMEOUT_S,
            server_settings={"default_transaction_read_only": "on",
                             "application_name": "agent-cli-gateway inspect"})
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError,
            asyncpg.ClientConfigurationError, asyncpg.InterfaceError) as exc:
        detail = redact_text(str(exc).replace(dsn, "***")) or type(exc).__name__
        raise StoreUnavailable(f"postgres store: connect failed ({type(exc).__name__}: "
                               f"{detail})") from None
    try:
        if not await conn.fetchval(_PG_HAS_VERSION_TABLE):
            return SchemaState(None)
        return SchemaState(int(await conn.fetchval(_PG_VERSION)))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"postgres store: read-only inspection failed "
                               f"({type(exc).__name__}: {redact_text(str(exc))})") from None
    finally:
        await conn.close(timeout=PG_CONNECT_TIMEOUT_S)
