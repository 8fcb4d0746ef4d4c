"""PostgreSQL SQL of the one-sweeper-per-interval claim (issue 29; base.py `claim_sweep`).

With twenty gateways on one database, each sweeping every interval, the reaper's probes,
re-queues and retention ran twenty times over. Now a sweep first claims its interval: one
conditional upsert whose WHERE is the invariant. `pg_try_advisory_xact_lock` in front of it
lets a claimer that races another skip at once instead of queueing on the row lock; it is
transaction-scoped, so it holds behind PgBouncer in transaction mode (a session lock would
not), and it goes with the transaction, whatever happens to the claimer.
"""

from __future__ import annotations

import asyncpg

# A migration (sql.py names its version), additive: one new table (as in
# sqlite/sweeps.py), and room on each page for the in-place updates of the hot rows (a
# heartbeat renews an instance row and its jobs' leases every heartbeat_s: with free space on
# the page they stay HOT updates, no index write, no page split). fillfactor applies to the
# pages written from now on.
SWEEPS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sweeps (
    task text PRIMARY KEY, last_at timestamptz NOT NULL, runs bigint NOT NULL)""",
    "ALTER TABLE gateway_instances SET (fillfactor = 50)",
    "ALTER TABLE jobs SET (fillfactor = 85)",
)

# A racing claimer (same task, same moment) gets false here and skips: one key per task.
TRY_SWEEP_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))"

# Invariant: at most one claim per `every` seconds per task, whoever races (the lock above
# only makes the losers quick: this WHERE is what decides, on the server's clock).
CLAIM_SWEEP = """
INSERT INTO sweeps (task, last_at, runs) VALUES ($1, clock_timestamp(), 1)
ON CONFLICT (task) DO UPDATE SET last_at = excluded.last_at, runs = sweeps.runs + 1
WHERE sweeps.last_at <= excluded.last_at - make_interval(secs => $2)
RETURNING runs
"""

READ_SWEEP_RUNS = "SELECT runs FROM sweeps WHERE task = $1"


async def claim_sweep(conn: asyncpg.Connection, task: str, every_s: float) -> bool:
    """Inside the caller's transaction."""
    if not await conn.fetchval(TRY_SWEEP_LOCK, task):
        return False
    return await conn.fetchval(CLAIM_SWEEP, task, float(every_s)) is not None


async def sweep_runs(conn: asyncpg.Connection, task: str) -> int:
    return int(await conn.fetchval(READ_SWEEP_RUNS, task) or 0)
