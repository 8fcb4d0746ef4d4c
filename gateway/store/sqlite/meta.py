"""SQLite: schema 7 (the store's lowest writer, the instances' renewal wait) and its check.

The rule itself lives in store/compat.py; this module is the SQLite half of it: the
statements and the two steps the migration transaction runs (store.py `_migrate`), on
the connection's thread, under the write lock: read the store's record and refuse before
the first write, then record who migrated it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.store import compat
from gateway.store.base import StoreUnavailable

# v7: `schema_meta` (key -> value: compat.META_MIN_WRITER, compat.META_MIGRATED_BY) and
# `gateway_instances.renewal_wait_ms_max_1h` (the worst renewal wait of the last hour, in
# ms, written with each heartbeat: `instances` shows it). The instances table is rebuilt as
# the jobs table was for v2..v6 (ALTER TABLE ADD COLUMN cannot be re-run), every v1 column
# copied; re-running the steps in order rebuilds the same table again.
_V1_INSTANCE_COLUMNS = ("instance_id, hostname, boot_id, pid, pid_started_at, role, version, "
                        "started_at, heartbeat_at, lease_expires_at, stopped_at")
SCHEMA_V7 = (
    """
    CREATE TABLE IF NOT EXISTS schema_meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """
    CREATE TABLE IF NOT EXISTS gateway_instances_v7 (
        instance_id            TEXT PRIMARY KEY,
        hostname               TEXT NOT NULL,
        boot_id                TEXT NOT NULL,
        pid                    INTEGER NOT NULL,
        pid_started_at         REAL,
        role                   TEXT NOT NULL,
        version                TEXT NOT NULL,
        started_at             REAL NOT NULL,
        heartbeat_at           REAL NOT NULL,
        lease_expires_at       REAL NOT NULL,
        stopped_at             REAL,
        renewal_wait_ms_max_1h REAL
    )""",
    f"INSERT INTO gateway_instances_v7 ({_V1_INSTANCE_COLUMNS}) "
    f"SELECT {_V1_INSTANCE_COLUMNS} FROM gateway_instances",
    "DROP TABLE gateway_instances",
    "ALTER TABLE gateway_instances_v7 RENAME TO gateway_instances",
)

# Read before any write of a migration: a store without the table (schema < 7) records none.
HAS_SCHEMA_META = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_meta'"
READ_SCHEMA_META = "SELECT key, value FROM schema_meta"
# One row per key; a later migrating gateway overwrites it (compat.meta_rows never lowers
# the lowest writer).
UPSERT_SCHEMA_META = """
INSERT INTO schema_meta (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value"""


def read_meta(db: sqlite3.Connection) -> dict[str, str]:
    """The store's schema_meta rows ({} before schema 7)."""
    if db.execute(HAS_SCHEMA_META).fetchone() is None:
        return {}
    return {str(key): str(value) for key, value in db.execute(READ_SCHEMA_META)}


def refuse_unless_writable(db: sqlite3.Connection, store: str, current: int) -> dict[str, str]:
    """Raise a permanent StoreUnavailable when this gateway may not write the store (before
    the migration writes anything); else the store's schema_meta rows."""
    meta = read_meta(db)
    problem = compat.refusal(store, current, meta)
    if problem is not None:
        raise StoreUnavailable(problem, permanent=True)
    return meta


def record_migration(db: sqlite3.Connection, applied: Sequence[int],
                     meta: dict[str, str]) -> None:
    """After the migrations `applied` (in the same transaction): who migrated the store and
    the lowest gateway that may write it from now on."""
    for key, value in compat.meta_rows(applied, meta).items():
        db.execute(UPSERT_SCHEMA_META, (key, value))
