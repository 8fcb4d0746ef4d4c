"""Usage totals and budget windows: the vocabulary every backend's SQL shares (issue 28).

Totals live in a rollup, `usage_daily`, one row per (UTC day, provider, model, cost_source),
written by the terminal write of each job in the transaction of its compare-and-set: a job is
counted exactly once, whichever gateway finished it, and `llm_usage` reads a few rows per day
instead of scanning the jobs (nor does retention's purge of old jobs erase what they cost).
A job that reported no usage at all is counted under cost_source `none`, apart.

Budgets live in `budget_windows`, one row per (budget, UTC window) with what was `spent` and
what admitted jobs hold `reserved`, and `budget_reservations`, what each active job holds
(so its terminal write settles the window it reserved in, even past midnight). Money is whole
micro-dollars (MICRO_USD) so that sums of cents stay exact; a job-count budget counts jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from gateway.model import MICRO_USD, ErrorKind, GatewayError, Reservation, UsageFigures
from providers.usage import INVALID_COST

__all__ = ["BudgetExceeded", "BudgetWindow", "Reservation", "UsageRow"]

GroupBy = Literal["provider", "model", "day"]
GROUP_BY: tuple[GroupBy, ...] = ("provider", "model", "day")
Period = Literal["day", "month"]
Unit = Literal["usd", "jobs"]
NO_USAGE = "none"  # the rollup's cost_source of jobs that reported no usage at all
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group and cost source of the rollup, summed over the days asked for (None: no
    job of it reported that figure)."""

    key: str  # the provider, the model ("" if unknown) or the day (YYYY-MM-DD)
    cost_source: str  # reported | estimated | absent | invalid | none
    jobs: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_micro_usd: int | None = None


@dataclass(frozen=True, slots=True)
class BudgetWindow:
    """A budget's window as the store holds it (spent and reserved in the budget's unit)."""

    budget: str
    window_start: str  # "YYYY-MM-DD" (day) or "YYYY-MM" (month), UTC
    spent: int = 0
    reserved: int = 0


class BudgetExceeded(GatewayError):
    """insert_job refused the job: admitting it would pass `reservation`'s limit. Nothing was
    written (the job row and any reservation of the same transaction are rolled back).
    `window` is the budget's window as the refusing transaction read it.

    A GatewayError (`budget_exceeded`, not retryable) whose message names the budget, what
    is left and when its window resets, so admission passes it to the caller as it is."""

    def __init__(self, reservation: Reservation, window: BudgetWindow) -> None:
        super().__init__(ErrorKind.BUDGET_EXCEEDED, refusal_text(reservation, window))
        self.reservation = reservation
        self.window = window


def _amount(unit: str, amount: int) -> str:
    return f"${amount / MICRO_USD:.2f}" if unit == "usd" else f"{amount} job(s)"


def refusal_text(held: Reservation, window: BudgetWindow) -> str:
    """What a refused caller reads: which budget, what is left, when it resets (UTC)."""
    section, _, key = held.budget.rpartition(".")
    where = f"[budgets.{section}] {key}" if section else f"[budgets] {key}"
    left = max(held.limit - window.spent - window.reserved, 0)
    resets = window_resets_at(held.period, window.window_start).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"Budget {where} would be exceeded: this job needs {_amount(held.unit, held.amount)}"
            f" but {_amount(held.unit, left)} is left of {_amount(held.unit, held.limit)} for "
            f"the UTC {held.period} {window.window_start} (spent "
            f"{_amount(held.unit, window.spent)}, reserved by running jobs "
            f"{_amount(held.unit, window.reserved)}). It resets at {resets}. Not retryable "
            f"before then: lower max_cost_usd, wait for running jobs to settle, or raise the "
            f"limit in the gateway config.")


# strftime formats of each period's window key (Python and SQLite; PostgreSQL's to_char
# formats are in postgres/usage.py).
WINDOW_FORMATS: dict[str, str] = {"day": "%Y-%m-%d", "month": "%Y-%m"}


def window_of(period: str, epoch_s: float | None = None) -> str:
    """The UTC window key of `period` at `epoch_s` (default: now)."""
    moment = time.time() if epoch_s is None else epoch_s
    return time.strftime(WINDOW_FORMATS[period], time.gmtime(moment))


def window_resets_at(period: str, window_start: str) -> datetime:
    """When the window `window_start` of `period` ends (UTC): the next day or month."""
    if period == "day":
        start = datetime.strptime(window_start, "%Y-%m-%d").replace(tzinfo=UTC)
        return datetime.fromordinal(start.toordinal() + 1).replace(tzinfo=UTC)
    year, month = (int(part) for part in window_start.split("-"))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def day_of(epoch_s: float) -> str:
    """The rollup's day of a terminal write at `epoch_s`."""
    return window_of("day", epoch_s)


def spent_on(unit: str, amount: int, usage: UsageFigures | None) -> int:
    """What settling a reservation of `amount` spends in its budget's unit: a job-count
    budget its one job; a money budget the job's cost, 0 when it reported none, and the
    whole reservation when the cost it reported was invalid (cost_source `invalid`: the CLI
    was capped at the reservation, the most the run can have cost). Never below 0: a
    negative would credit the window and admit jobs past its limit (#38)."""
    if unit == "jobs":
        return amount
    if usage is None:
        return 0
    if usage.cost_source == INVALID_COST:  # providers/usage.py says when
        return amount
    return max(usage.cost_micro_usd or 0, 0)


def add_figure(total: int | None, figure: int | None) -> int | None:
    """A rollup sum: None until some job reports the figure (a missing one is never 0)."""
    if figure is None:
        return total
    return (total or 0) + figure


def summed(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """Rows of equal (key, cost_source) added up: how a backend without GROUP BY (memory)
    answers usage_totals, and what the SQL backends' GROUP BY does."""
    totals: dict[tuple[str, str], UsageRow] = {}
    for row in rows:
        held = totals.get((row.key, row.cost_source))
        if held is None:
            totals[(row.key, row.cost_source)] = row
            continue
        totals[(row.key, row.cost_source)] = UsageRow(
            key=row.key, cost_source=row.cost_source, jobs=held.jobs + row.jobs,
            input_tokens=add_figure(held.input_tokens, row.input_tokens),
            output_tokens=add_figure(held.output_tokens, row.output_tokens),
            cache_read_tokens=add_figure(held.cache_read_tokens, row.cache_read_tokens),
            cache_creation_tokens=add_figure(held.cache_creation_tokens,
                                             row.cache_creation_tokens),
            cost_micro_usd=add_figure(held.cost_micro_usd, row.cost_micro_usd))
    return sorted(totals.values(), key=lambda r: (r.key, r.cost_source))
