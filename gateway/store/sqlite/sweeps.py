"""SQLite SQL of the one-sweeper-per-interval claim (issue 29; base.py `claim_sweep`).

The gateways sharing one SQLite file are on one host, so the claim alone decides: one
conditional upsert inside the caller's `BEGIN IMMEDIATE` transaction (store.py
`_transaction`), which SQLite already serializes.
"""

from __future__ import annotations

import sqlite3

import aiosqlite

# A migration (sql.py names its version), additive: one new table, a row per periodic
# task with its last claim on the store's clock and how many runs were claimed.
SWEEPS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sweeps (
    task TEXT PRIMARY KEY, last_at REAL NOT NULL, runs INTEGER NOT NULL)""",
)

# Invariant: at most one claim per `every` seconds per task, whoever races. The DO UPDATE
# applies only when the last claim is at least `every` old, so of two claimers in one
# interval the second changes nothing (rowcount 0) and skips.
CLAIM_SWEEP = """
INSERT INTO sweeps (task, last_at, runs) VALUES (:task, :now, 1)
ON CONFLICT (task) DO UPDATE SET last_at = excluded.last_at, runs = sweeps.runs + 1
WHERE sweeps.last_at <= excluded.last_at - :every
"""

READ_SWEEP_RUNS = "SELECT runs FROM sweeps WHERE task = ?"


def claim_sweep(db: sqlite3.Connection, task: str, every_s: float, now: float) -> bool:
    return db.execute(CLAIM_SWEEP, {"task": task, "now": now, "every": every_s}).rowcount == 1


async def sweep_runs(conn: aiosqlite.Connection, task: str) -> int:
    async with conn.execute(READ_SWEEP_RUNS, (task,)) as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row else 0
