"""SQLite SQL of usage totals and budgets (issue 28; gateway/store/usage.py says the model).

Every function here runs on the connection's thread inside the caller's `BEGIN IMMEDIATE`
transaction (store.py `_transaction`), so it commits or rolls back with the job write it
belongs to: the insert that admits a job, the guarded terminal write that ends it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.model import Reservation, UsageFigures
from gateway.store.base import ACTIVE_STATUSES_SQL
from gateway.store.usage import (
    NO_USAGE,
    BudgetExceeded,
    BudgetWindow,
    GroupBy,
    UsageRow,
    day_of,
    spent_on,
    window_of,
)

# Schema version 5: additive, three new tables. The rollup's key starts with the day, so
# every llm_usage read is a range of its primary key, whatever it groups by.
SCHEMA_V5 = (
    """CREATE TABLE IF NOT EXISTS usage_daily (
    day TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, cost_source TEXT NOT NULL,
    jobs INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER, output_tokens INTEGER,
    cache_read_tokens INTEGER, cache_creation_tokens INTEGER, cost_micro_usd INTEGER,
    PRIMARY KEY (day, provider, model, cost_source))""",
    """CREATE TABLE IF NOT EXISTS budget_windows (
    budget TEXT NOT NULL, window_start TEXT NOT NULL,
    spent INTEGER NOT NULL DEFAULT 0, reserved INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (budget, window_start))""",
    """CREATE TABLE IF NOT EXISTS budget_reservations (
    job_id TEXT NOT NULL, budget TEXT NOT NULL, window_start TEXT NOT NULL,
    unit TEXT NOT NULL, amount INTEGER NOT NULL, PRIMARY KEY (job_id, budget))""",
)

# Invariant: spent + reserved <= limit for every window, after every admission. One
# statement per budget: the window's first job inserts its row (only if the amount alone
# fits), every later one adds to it only if the sum still fits. BEGIN IMMEDIATE holds the
# file's write lock from before this read, so no other process admits in between; a
# statement that changed no row is a refusal, and the caller rolls back the whole admission.
RESERVE_BUDGET = """
INSERT INTO budget_windows (budget, window_start, spent, reserved)
SELECT :budget, :window_start, 0, :amount WHERE :amount <= :limit
ON CONFLICT (budget, window_start) DO UPDATE SET reserved = reserved + excluded.reserved
WHERE spent + reserved + excluded.reserved <= :limit"""

RECORD_RESERVATION = """
INSERT INTO budget_reservations (job_id, budget, window_start, unit, amount)
VALUES (:job_id, :budget, :window_start, :unit, :amount)"""

READ_BUDGET_WINDOW = """
SELECT budget, window_start, spent, reserved FROM budget_windows
WHERE budget = :budget AND window_start = :window_start"""

# Settlement takes the job's reservations away (DELETE ... RETURNING: whoever deletes a row
# settles it, exactly once: the terminal write or the sweeper, never both) and moves each
# amount from reserved to what was really spent.
TAKE_RESERVATIONS = """
DELETE FROM budget_reservations WHERE job_id = :job_id
RETURNING budget, window_start, unit, amount"""

SETTLE_BUDGET = """
UPDATE budget_windows SET reserved = reserved - :amount, spent = spent + :spent
WHERE budget = :budget AND window_start = :window_start"""

# The sweeper's share: reservations of jobs that ended without settling them (the reaper
# orphaned them) or whose row is gone. An active job's reservation is never released.
TAKE_ENDED_RESERVATIONS = f"""
DELETE FROM budget_reservations
WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = budget_reservations.job_id
                                     AND jobs.status IN {ACTIVE_STATUSES_SQL})
RETURNING budget, window_start, unit, amount"""

# A terminal write adds its job once to its day's rollup row (the caller runs this only when
# the guarded write applied). A figure not reported leaves the sum as it was: NULL stays
# NULL until some job of the group reports it.
ADD_USAGE = """
INSERT INTO usage_daily (day, provider, model, cost_source, jobs, input_tokens, output_tokens,
                         cache_read_tokens, cache_creation_tokens, cost_micro_usd)
SELECT :day, provider, COALESCE(NULLIF(:model, ''), model, ''), :cost_source, 1,
       :input_tokens, :output_tokens, :cache_read_tokens, :cache_creation_tokens,
       :cost_micro_usd
FROM jobs WHERE id = :job_id
ON CONFLICT (day, provider, model, cost_source) DO UPDATE SET
    jobs = jobs + 1,
    input_tokens = CASE WHEN excluded.input_tokens IS NULL THEN input_tokens
                        ELSE COALESCE(input_tokens, 0) + excluded.input_tokens END,
    output_tokens = CASE WHEN excluded.output_tokens IS NULL THEN output_tokens
                         ELSE COALESCE(output_tokens, 0) + excluded.output_tokens END,
    cache_read_tokens = CASE WHEN excluded.cache_read_tokens IS NULL THEN cache_read_tokens
                             ELSE COALESCE(cache_read_tokens, 0) + excluded.cache_read_tokens END,
    cache_creation_tokens = CASE WHEN excluded.cache_creation_tokens IS NULL
                                 THEN cache_creation_tokens
                                 ELSE COALESCE(cache_creation_tokens, 0)
                                      + excluded.cache_creation_tokens END,
    cost_micro_usd = CASE WHEN excluded.cost_micro_usd IS NULL THEN cost_micro_usd
                          ELSE COALESCE(cost_micro_usd, 0) + excluded.cost_micro_usd END"""

# One statement per grouping (the column comes from this fixed table, never from a caller):
# a range of the rollup's primary key, a few rows per day.
USAGE_TOTALS = {group: f"""
SELECT {group} AS key, cost_source, SUM(jobs) AS jobs, SUM(input_tokens) AS input_tokens,
       SUM(output_tokens) AS output_tokens, SUM(cache_read_tokens) AS cache_read_tokens,
       SUM(cache_creation_tokens) AS cache_creation_tokens,
       SUM(cost_micro_usd) AS cost_micro_usd
FROM usage_daily WHERE day >= :since AND day <= :until
GROUP BY {group}, cost_source ORDER BY {group}, cost_source""" for group in
    ("provider", "model", "day")}

EARLIEST_DAY, LATEST_DAY = "0000-00-00", "9999-99-99"  # an open end of a day range


def reserve(db: sqlite3.Connection, job_id: str, reservations: Sequence[Reservation],
            now: float) -> None:
    """Hold every reservation of a job being admitted, in the given (fixed) order; raise
    BudgetExceeded at the first that does not fit (the caller's transaction rolls back)."""
    for held in reservations:
        window_start = window_of(held.period, now)
        params = {"budget": held.budget, "window_start": window_start,
                  "amount": held.amount, "limit": held.limit}
        if db.execute(RESERVE_BUDGET, params).rowcount != 1:
            row = db.execute(READ_BUDGET_WINDOW, params).fetchone()
            window = (BudgetWindow(row[0], row[1], int(row[2]), int(row[3])) if row
                      else BudgetWindow(held.budget, window_start))
            raise BudgetExceeded(held, window)
        db.execute(RECORD_RESERVATION, {**params, "job_id": job_id, "unit": held.unit})


def _settle_rows(db: sqlite3.Connection, rows: Sequence[tuple[str, str, str, int]],
                 usage: UsageFigures | None) -> None:
    for budget, window_start, unit, amount in rows:
        db.execute(SETTLE_BUDGET, {"budget": budget, "window_start": window_start,
                                   "amount": amount,
                                   "spent": spent_on(unit, amount, usage)})


def account(db: sqlite3.Connection, job_id: str, usage: UsageFigures | None,
            now: float) -> None:
    """A terminal write that applied: settle the job's reservations with its real cost and
    add it to the usage totals."""
    cost = usage.cost_micro_usd if usage else None
    _settle_rows(db, db.execute(TAKE_RESERVATIONS, {"job_id": job_id}).fetchall(), usage)
    db.execute(ADD_USAGE, {
        "day": day_of(now), "job_id": job_id, "model": usage.model if usage else None,
        "cost_source": usage.cost_source if usage else NO_USAGE,
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        "cache_read_tokens": usage.cache_read_tokens if usage else None,
        "cache_creation_tokens": usage.cache_creation_tokens if usage else None,
        "cost_micro_usd": cost,
    })


def release_ended(db: sqlite3.Connection) -> int:
    """The sweeper: release what jobs that ended without settling still hold."""
    rows = db.execute(TAKE_ENDED_RESERVATIONS).fetchall()
    _settle_rows(db, rows, None)
    return len(rows)


def usage_totals(db: sqlite3.Connection, group_by: GroupBy, since_day: str | None,
                 until_day: str | None) -> list[UsageRow]:
    rows = db.execute(USAGE_TOTALS[group_by], {"since": since_day or EARLIEST_DAY,
                                               "until": until_day or LATEST_DAY})
    return [UsageRow(key=r[0], cost_source=r[1], jobs=int(r[2]), input_tokens=r[3],
                     output_tokens=r[4], cache_read_tokens=r[5], cache_creation_tokens=r[6],
                     cost_micro_usd=r[7]) for r in rows]


def budget_windows(db: sqlite3.Connection, budgets: Sequence[tuple[str, str]],
                   now: float) -> list[BudgetWindow]:
    windows = []
    for budget, period in budgets:
        window_start = window_of(period, now)
        row = db.execute(READ_BUDGET_WINDOW, {"budget": budget,
                                              "window_start": window_start}).fetchone()
        windows.append(BudgetWindow(budget, window_start, int(row[2]), int(row[3])) if row
                       else BudgetWindow(budget, window_start))
    return windows
