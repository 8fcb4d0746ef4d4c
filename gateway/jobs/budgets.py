"""Which `[budgets]` limits a request reserves against, and what gateway_status shows of them.

Admission reserves an amount per job against every limit that applies (docs/architecture.md, Budgets;
docs/architecture.md, *Budgets*): the caller's `max_cost_usd` if it gave one, else
`[budgets] job_reservation_usd`, else DEFAULT_RESERVATION_USD. The store holds all of them in
the insert's own transaction, one conditional write per budget in the fixed order built here
(sorted by name), so admissions on any number of gateways never overspend and never wait on
each other in a circle. Money limits count only providers that report a cost (their CLI
stops itself at the reservation too: claude --max-budget-usd, vibe --max-price); any provider
counts against its `max_jobs_per_day`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.config import BudgetsConfig, Settings
from gateway.model import Reservation, from_micro_usd, to_micro_usd
from gateway.store.base import JobStore
from gateway.store.usage import window_resets_at
from providers.registry import REPORTS_COST

# What a job reserves when neither its caller nor the config says: a typical single claude
# -p task costs cents; a quarter keeps a $1 daily limit at four concurrent jobs.
DEFAULT_RESERVATION_USD = 0.25


@dataclass(frozen=True, slots=True)
class Limit:
    """One configured limit: its config path, window, unit and value (micro-USD or jobs)."""

    budget: str
    period: str  # "day" | "month"
    unit: str  # "usd" | "jobs"
    limit: int
    provider: str | None  # None: every cost-reporting provider together


def configured_limits(budgets: BudgetsConfig) -> list[Limit]:
    """Every limit the config sets, sorted by name: the fixed reservation order."""
    limits: list[Limit] = []
    for period, value in (("day", budgets.daily_usd), ("month", budgets.monthly_usd)):
        if value is not None:
            limits.append(Limit(period_key(period), period, "usd", to_micro_usd(value), None))
    for name, own in budgets.providers.items():
        for period, value in (("day", own.daily_usd), ("month", own.monthly_usd)):
            if value is not None:
                limits.append(Limit(f"providers.{name}.{period_key(period)}", period, "usd",
                                    to_micro_usd(value), name))
        if own.max_jobs_per_day is not None:
            limits.append(Limit(f"providers.{name}.max_jobs_per_day", "day", "jobs",
                                own.max_jobs_per_day, name))
    return sorted(limits, key=lambda limit: limit.budget)


def period_key(period: str) -> str:
    return "daily_usd" if period == "day" else "monthly_usd"


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    reservations: tuple[Reservation, ...]
    cap_usd: float | None  # what the CLI is told it may spend (None: no cap)


def plan(settings: Settings, provider: str, max_cost_usd: float | None) -> BudgetPlan:
    """What admitting a request for `provider` reserves, and the cap its CLI gets."""
    budgets = settings.budgets
    amount = max_cost_usd or budgets.job_reservation_usd or DEFAULT_RESERVATION_USD
    reservations: list[Reservation] = []
    for limit in configured_limits(budgets):
        if limit.provider not in (None, provider):
            continue
        if limit.unit == "jobs":
            reservations.append(Reservation(limit.budget, limit.period, "jobs", 1, limit.limit))
        elif provider in REPORTS_COST:
            reservations.append(Reservation(limit.budget, limit.period, "usd",
                                            to_micro_usd(amount), limit.limit))
    reserves_money = any(r.unit == "usd" for r in reservations)
    cap = max_cost_usd if max_cost_usd is not None else (amount if reserves_money else None)
    return BudgetPlan(tuple(reservations), cap)


async def budget_status(settings: Settings, store: JobStore) -> list[dict[str, Any]]:
    """Each configured budget's current window: spent, reserved (by active jobs), left."""
    limits = configured_limits(settings.budgets)
    if not limits:
        return []
    windows = await store.budget_windows([(limit.budget, limit.period) for limit in limits])
    shown = []
    for limit, window in zip(limits, windows, strict=True):
        scale = from_micro_usd if limit.unit == "usd" else int
        left = max(limit.limit - window.spent - window.reserved, 0)
        shown.append({
            "budget": limit.budget, "unit": limit.unit, "limit": scale(limit.limit),
            "spent": scale(window.spent), "reserved": scale(window.reserved),
            "left": scale(left), "window": window.window_start,
            "resets_at": window_resets_at(limit.period, window.window_start).isoformat(),
        })
    return shown
