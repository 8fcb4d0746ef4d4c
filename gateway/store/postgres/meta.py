"""PostgreSQL: schema 7 (the store's lowest writer, the instances' renewal wait) and its check.

The rule itself lives in store/compat.py; this module is the PostgreSQL half of it: the
statements and the two steps the migration transaction runs (store.py `_migrate`) under
the schema lock: read the store's record and refuse before the first write, then record who
migrated it.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from gateway.store import compat
from gateway.store.base import StoreUnavailable

# v7: `schema_meta` (key -> value: compat.META_MIN_WRITER, compat.META_MIGRATED_BY) and
# `gateway_instances.renewal_wait_ms_max_1h` (the worst renewal wait of the last hour, in
# ms, written with each heartbeat: `instances` shows it). Additive, each step idempotent.
SCHEMA_V7 = (
    """
    CREATE TABLE IF NOT EXISTS schema_meta (
        key   text PRIMARY KEY,
        value text NOT NULL
    )""",
    "ALTER TABLE gateway_instances ADD COLUMN IF NOT EXISTS renewal_wait_ms_max_1h "
    "double precision",
)

# Read before any write of a migration: a database before schema 7 has no such table.
HAS_SCHEMA_META = "SELECT to_regclass('schema_meta') IS NOT NULL"
READ_SCHEMA_META = "SELECT key, value FROM schema_meta"
# One row per key; a later migrating gateway overwrites it (compat.meta_rows never lowers
# the lowest writer). Written under the schema lock, like the migration itself.
UPSERT_SCHEMA_META = """
INSERT INTO schema_meta (key, value) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET value = excluded.value"""


async def read_meta(conn: asyncpg.Connection) -> dict[str, str]:
    """The database's schema_meta rows ({} before schema 7)."""
    if not await conn.fetchval(HAS_SCHEMA_META):
        return {}
    return {str(row["key"]): str(row["value"]) for row in await conn.fetch(READ_SCHEMA_META)}


async def refuse_unless_writable(conn: asyncpg.Connection, current: int) -> dict[str, str]:
    """Raise a permanent StoreUnavailable when this gateway may not write the database
    (before the migration writes anything); else its schema_meta rows."""
    meta = await read_meta(conn)
    problem = compat.refusal("postgres store", current, meta)
    if problem is not None:
        raise StoreUnavailable(problem, permanent=True)
    return meta


async def record_migration(conn: asyncpg.Connection, applied: Sequence[int],
                           meta: dict[str, str]) -> None:
    """After the migrations `applied` (in the same transaction): who migrated the database
    and the lowest gateway that may write it from now on."""
    for key, value in compat.meta_rows(applied, meta).items():
        await conn.execute(UPSERT_SCHEMA_META, key, value)
