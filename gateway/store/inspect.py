"""Read-only look at a store's schema: which version it holds, or that there is none yet.

`open_store` creates and migrates (the gateway's job at startup); `doctor` and the read-only
`jobs` commands must never do either: a newer CLI run against a shared database would
upgrade it under older gateways, which then refuse it. So this module opens nothing it
could create: SQLite is opened read-only when the file exists (`mode=ro`, never created),
PostgreSQL in a read-only session that only reads information_schema and the version table.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import anyio

from gateway.config import Settings
from gateway.store.base import SCHEMA_VERSION, StoreUnavailable

SQLITE_BUSY_TIMEOUT_S = 5.0  # a writer holding the lock briefly is waited for, not reported

_SQLITE_HAS_VERSION_TABLE = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
_SQLITE_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a store holds. `version` None: no gateway has created the schema yet."""

    version: int | None
    exists: bool = True  # False: a SQLite file that is not there
    # PostgreSQL: gateway_connections, client_connections, max_connections (doctor, #29)
    connections: dict[str, int] | None = None

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
        return await anyio.to_thread.run_sync(_inspect_sqlite, persistence.path)
    if persistence.backend == "postgres":
        if not persistence.dsn:
            raise StoreUnavailable("persistence.dsn is required for the postgres backend")
        # asyncpg: the postgres extra.
        from gateway.store.postgres.inspect import read_schema_version  # deferred: optional dependency

        version, connections = await read_schema_version(persistence.dsn, persistence.pooler)
        return SchemaState(version, connections=connections)
    return SchemaState(SCHEMA_VERSION)


def _inspect_sqlite(path: Path) -> SchemaState:
    """Only a file that is not there is "not created yet": one that cannot be looked at (an
    unreadable state dir, a file where a directory should be) is an error to fix, never "no
    jobs yet" (#44: `jobs list` said so and exited 0 where doctor failed)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # whether it can be made: fs.uncreatable
        return SchemaState(None, exists=False)
    except OSError as exc:
        raise StoreUnavailable(f"sqlite store {path} cannot be read ({exc.strerror or exc}); "
                               f"fix the permissions of its directory or set [persistence] "
                               f"path", permanent=True) from None
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
