"""PostgreSQL SQL of usage totals and budgets (issue 28; gateway/store/usage.py says the model).

The same statements as sqlite/usage.py in this dialect. Every function runs on the caller's
connection inside its transaction (store.py), so it commits or rolls back with the job
write it belongs to. Windows and days come from the database clock (`now()` in UTC), never
from a gateway's wall clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.model import Reservation, UsageFigures
from gateway.store.base import ACTIVE_STATUSES_SQL
from gateway.store.usage import (
    NO_USAGE,
    BudgetExceeded,
    BudgetWindow,
    GroupBy,
    UsageRow,
    spent_on,
)

if TYPE_CHECKING:  # asyncpg is imported only by postgres.py (the postgres extra)
    import asyncpg

# to_char formats of each period's window key (the same keys as usage.WINDOW_FORMATS).
PG_WINDOW_FORMATS = {"day": "YYYY-MM-DD", "month": "YYYY-MM"}

# Schema version 5: additive, three new tables (see sqlite/usage.py SCHEMA_V5).
SCHEMA_V5 = (
    """CREATE TABLE IF NOT EXISTS usage_daily (
    day text NOT NULL, provider text NOT NULL, model text NOT NULL, cost_source text NOT NULL,
    jobs bigint NOT NULL DEFAULT 0, input_tokens bigint, output_tokens bigint,
    cache_read_tokens bigint, cache_creation_tokens bigint, cost_micro_usd bigint,
    PRIMARY KEY (day, provider, model, cost_source))""",
    """CREATE TABLE IF NOT EXISTS budget_windows (
    budget text NOT NULL, window_start text NOT NULL,
    spent bigint NOT NULL DEFAULT 0, reserved bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (budget, window_start))""",
    """CREATE TABLE IF NOT EXISTS budget_reservations (
    job_id text NOT NULL, budget text NOT NULL, window_start text NOT NULL,
    unit text NOT NULL, amount bigint NOT NULL, PRIMARY KEY (job_id, budget))""",
)

_WINDOW = "to_char(now() AT TIME ZONE 'UTC', $2::text)"

# Invariant: spent + reserved <= limit for every window, after every admission, however many
# gateways admit at once. One statement per budget: the window's first job inserts its row
# (only if the amount alone fits); a concurrent first insert waits on the primary key and
# then takes the DO UPDATE path, which locks the row and re-checks the sum against the
# newest committed version (READ COMMITTED), so two admissions can never both see room for
# one. No row returned is a refusal: the caller rolls back the whole admission. Budgets are
# reserved in one fixed order (budgets.py), so two admissions never wait on each other in a
# circle.
RESERVE_BUDGET = f"""
INSERT INTO budget_windows AS w (budget, window_start, spent, reserved)
SELECT $1::text, {_WINDOW}, 0, $3::bigint WHERE $3::bigint <= $4::bigint
ON CONFLICT (budget, window_start) DO UPDATE SET reserved = w.reserved + EXCLUDED.reserved
WHERE w.spent + w.reserved + EXCLUDED.reserved <= $4::bigint
RETURNING window_start"""

RECORD_RESERVATION = """
INSERT INTO budget_reservations (job_id, budget, window_start, unit, amount)
VALUES ($1, $2, $3, $4, $5)"""

READ_BUDGET_WINDOW = f"""
SELECT $1::text AS budget, {_WINDOW} AS window_start,
       COALESCE((SELECT spent FROM budget_windows
                 WHERE budget = $1 AND window_start = {_WINDOW}), 0) AS spent,
       COALESCE((SELECT reserved FROM budget_windows
                 WHERE budget = $1 AND window_start = {_WINDOW}), 0) AS reserved"""

# Whoever deletes a reservation settles it, exactly once: a concurrent DELETE of the same
# row waits for this one and then finds nothing (the terminal write and the sweeper never
# both settle one job).
TAKE_RESERVATIONS = """
DELETE FROM budget_reservations WHERE job_id = $1
RETURNING budget, window_start, unit, amount"""

SETTLE_BUDGET = """
UPDATE budget_windows SET reserved = reserved - $3, spent = spent + $4
WHERE budget = $1 AND window_start = $2"""

# The sweeper's share: reservations of jobs that are no longer active (orphaned by the
# reaper without a terminal write) or whose row is gone.
TAKE_ENDED_RESERVATIONS = f"""
DELETE FROM budget_reservations r
WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = r.job_id
                                        AND j.status IN {ACTIVE_STATUSES_SQL})
RETURNING budget, window_start, unit, amount"""

# A terminal write that applied adds its job once to its day's rollup row; a figure not
# reported leaves the sum as it was (NULL until some job of the group reports it).
ADD_USAGE = """
INSERT INTO usage_daily AS u (day, provider, model, cost_source, jobs, input_tokens,
                              output_tokens, cache_read_tokens, cache_creation_tokens,
                              cost_micro_usd)
SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'), j.provider,
       COALESCE(NULLIF($2::text, ''), j.model, ''), $3::text, 1, $4::bigint, $5::bigint,
       $6::bigint, $7::bigint, $8::bigint
FROM jobs j WHERE j.id = $1
ON CONFLICT (day, provider, model, cost_source) DO UPDATE SET
    jobs = u.jobs + 1,
    input_tokens = CASE WHEN EXCLUDED.input_tokens IS NULL THEN u.input_tokens
                        ELSE COALESCE(u.input_tokens, 0) + EXCLUDED.input_tokens END,
    output_tokens = CASE WHEN EXCLUDED.output_tokens IS NULL THEN u.output_tokens
                         ELSE COALESCE(u.output_tokens, 0) + EXCLUDED.output_tokens END,
    cache_read_tokens = CASE WHEN EXCLUDED.cache_read_tokens IS NULL THEN u.cache_read_tokens
                             ELSE COALESCE(u.cache_read_tokens, 0)
                                  + EXCLUDED.cache_read_tokens END,
    cache_creation_tokens = CASE WHEN EXCLUDED.cache_creation_tokens IS NULL
                                 THEN u.cache_creation_tokens
                                 ELSE COALESCE(u.cache_creation_tokens, 0)
                                      + EXCLUDED.cache_creation_tokens END,
    cost_micro_usd = CASE WHEN EXCLUDED.cost_micro_usd IS NULL THEN u.cost_micro_usd
                          ELSE COALESCE(u.cost_micro_usd, 0) + EXCLUDED.cost_micro_usd END"""

# A range of the rollup's primary key (it starts with the day), grouped by a column from
# this fixed table, never from a caller.
USAGE_TOTALS = {group: f"""
SELECT {group} AS key, cost_source, SUM(jobs)::bigint AS jobs,
       SUM(input_tokens)::bigint AS input_tokens, SUM(output_tokens)::bigint AS output_tokens,
       SUM(cache_read_tokens)::bigint AS cache_read_tokens,
       SUM(cache_creation_tokens)::bigint AS cache_creation_tokens,
       SUM(cost_micro_usd)::bigint AS cost_micro_usd
FROM usage_daily WHERE day >= $1 AND day <= $2
GROUP BY {group}, cost_source ORDER BY {group}, cost_source""" for group in
    ("provider", "model", "day")}

EARLIEST_DAY, LATEST_DAY = "0000-00-00", "9999-99-99"  # an open end of a day range


async def reserve(conn: asyncpg.Connection, job_id: str,
                  reservations: Sequence[Reservation]) -> None:
    """Hold every reservation of a job being admitted, in the given (fixed) order; raise
    BudgetExceeded at the first that does not fit (the caller's transaction rolls back)."""
    for held in reservations:
        fmt = PG_WINDOW_FORMATS[held.period]
        window_start = await conn.fetchval(RESERVE_BUDGET, held.budget, fmt, held.amount,
                                           held.limit)
        if window_start is None:
            row = await conn.fetchrow(READ_BUDGET_WINDOW, held.budget, fmt)
            raise BudgetExceeded(held, BudgetWindow(row["budget"], row["window_start"],
                                                    int(row["spent"]), int(row["reserved"])))
        await conn.execute(RECORD_RESERVATION, job_id, held.budget, window_start, held.unit,
                           held.amount)


async def _settle_rows(conn: asyncpg.Connection, rows: Sequence[asyncpg.Record],
                       usage: UsageFigures | None) -> None:
    for row in rows:
        amount = int(row["amount"])
        await conn.execute(SETTLE_BUDGET, row["budget"], row["window_start"], amount,
                           spent_on(row["unit"], amount, usage))


async def account(conn: asyncpg.Connection, job_id: str, usage: UsageFigures | None) -> None:
    """A terminal write that applied: settle the job's reservations with its real cost and
    add it to the usage totals (same transaction)."""
    cost = usage.cost_micro_usd if usage else None
    await _settle_rows(conn, await conn.fetch(TAKE_RESERVATIONS, job_id), usage)
    await conn.execute(
        ADD_USAGE, job_id, usage.model if usage else None,
        usage.cost_source if usage else NO_USAGE,
        usage.input_tokens if usage else None, usage.output_tokens if usage else None,
        usage.cache_read_tokens if usage else None,
        usage.cache_creation_tokens if usage else None, cost)


async def release_ended(conn: asyncpg.Connection) -> int:
    rows = await conn.fetch(TAKE_ENDED_RESERVATIONS)
    await _settle_rows(conn, rows, None)
    return len(rows)


async def usage_totals(conn: asyncpg.Connection, group_by: GroupBy, since_day: str | None,
                       until_day: str | None) -> list[UsageRow]:
    rows = await conn.fetch(USAGE_TOTALS[group_by], since_day or EARLIEST_DAY,
                            until_day or LATEST_DAY)
    return [UsageRow(key=r["key"], cost_source=r["cost_source"], jobs=int(r["jobs"]),
                     input_tokens=r["input_tokens"], output_tokens=r["output_tokens"],
                     cache_read_tokens=r["cache_read_tokens"],
                     cache_creation_tokens=r["cache_creation_tokens"],
                     cost_micro_usd=r["cost_micro_usd"]) for r in rows]


async def budget_windows(conn: asyncpg.Connection,
                         budgets: Sequence[tuple[str, str]]) -> list[BudgetWindow]:
    windows = []
    for budget, period in budgets:
        row = await conn.fetchrow(READ_BUDGET_WINDOW, budget, PG_WINDOW_FORMATS[period])
        windows.append(BudgetWindow(row["budget"], row["window_start"], int(row["spent"]),
                                    int(row["reserved"])))
    return windows
