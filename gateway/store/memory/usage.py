"""The memory store's usage totals and budgets: the rules of sqlite/usage.py held in dicts.

MemoryJobStore calls these under its one lock, inside the method whose transaction they
belong to (insert_job, complete), so each is as atomic as the SQL backends' statements.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from gateway.model import Reservation, UsageFigures
from gateway.store.usage import (
    NO_USAGE,
    BudgetExceeded,
    BudgetWindow,
    GroupBy,
    UsageRow,
    add_figure,
    day_of,
    spent_on,
    summed,
    window_of,
)


@dataclass(slots=True)
class _Held:
    budget: str
    window_start: str
    unit: str
    amount: int


@dataclass(slots=True)
class MemoryLedger:
    """The three tables of schema version 5, for one process."""

    # (day, provider, model, cost_source) -> the rollup row
    rollup: dict[tuple[str, str, str, str], UsageRow] = field(default_factory=dict)
    windows: dict[tuple[str, str], BudgetWindow] = field(default_factory=dict)
    reservations: dict[str, list[_Held]] = field(default_factory=dict)  # job id -> held

    def reserve(self, job_id: str, reservations: Sequence[Reservation], now: float) -> None:
        """All of a job's reservations or none (RESERVE_BUDGET's invariant: spent + reserved
        <= limit): every one is checked before any is held."""
        planned = []
        for held in reservations:
            key = (held.budget, window_of(held.period, now))
            window = self.windows.get(key, BudgetWindow(*key))
            if window.spent + window.reserved + held.amount > held.limit:
                raise BudgetExceeded(held, window)
            planned.append((key, held))
        for key, held in planned:
            window = self.windows.get(key, BudgetWindow(*key))
            self.windows[key] = BudgetWindow(*key, spent=window.spent,
                                             reserved=window.reserved + held.amount)
            self.reservations.setdefault(job_id, []).append(
                _Held(held.budget, key[1], held.unit, held.amount))

    def snapshot(self) -> tuple[dict[tuple[str, str], BudgetWindow], dict[str, list[_Held]]]:
        """The budgets' state, for a caller that must undo several reserve() calls (a
        group's admission is all its jobs' reservations or none)."""
        return dict(self.windows), {job: list(held) for job, held in self.reservations.items()}

    def restore(self, state: tuple[dict[tuple[str, str], BudgetWindow],
                                   dict[str, list[_Held]]]) -> None:
        self.windows, self.reservations = dict(state[0]), dict(state[1])

    def _settle(self, held: list[_Held], usage: UsageFigures | None) -> None:
        for one in held:
            key = (one.budget, one.window_start)
            window = self.windows.get(key, BudgetWindow(*key))
            spent = spent_on(one.unit, one.amount, usage)
            self.windows[key] = BudgetWindow(*key, spent=window.spent + spent,
                                             reserved=window.reserved - one.amount)

    def account(self, job_id: str, provider: str, job_model: str | None,
                usage: UsageFigures | None, now: float) -> None:
        cost = usage.cost_micro_usd if usage else None
        self._settle(self.reservations.pop(job_id, []), usage)
        model = (usage.model if usage and usage.model else None) or job_model or ""
        key = (day_of(now), provider, model, usage.cost_source if usage else NO_USAGE)
        row = self.rollup.get(key, UsageRow(key="", cost_source=key[3], jobs=0))
        self.rollup[key] = UsageRow(
            key="", cost_source=key[3], jobs=row.jobs + 1,
            input_tokens=add_figure(row.input_tokens, usage.input_tokens if usage else None),
            output_tokens=add_figure(row.output_tokens, usage.output_tokens if usage else None),
            cache_read_tokens=add_figure(row.cache_read_tokens,
                                         usage.cache_read_tokens if usage else None),
            cache_creation_tokens=add_figure(row.cache_creation_tokens,
                                             usage.cache_creation_tokens if usage else None),
            cost_micro_usd=add_figure(row.cost_micro_usd, cost))

    def release_ended(self, active_job_ids: Collection[str]) -> int:
        ended = [job_id for job_id in self.reservations if job_id not in active_job_ids]
        for job_id in ended:
            self._settle(self.reservations.pop(job_id), None)
        return len(ended)

    def totals(self, group_by: GroupBy, since_day: str | None,
               until_day: str | None) -> list[UsageRow]:
        position = {"day": 0, "provider": 1, "model": 2}[group_by]
        return summed(
            UsageRow(key=key[position], cost_source=row.cost_source, jobs=row.jobs,
                     input_tokens=row.input_tokens, output_tokens=row.output_tokens,
                     cache_read_tokens=row.cache_read_tokens,
                     cache_creation_tokens=row.cache_creation_tokens,
                     cost_micro_usd=row.cost_micro_usd)
            for key, row in self.rollup.items()
            if (since_day is None or key[0] >= since_day)
            and (until_day is None or key[0] <= until_day))

    def current(self, budgets: Sequence[tuple[str, str]], now: float) -> list[BudgetWindow]:
        windows = []
        for budget, period in budgets:
            key = (budget, window_of(period, now))
            windows.append(self.windows.get(key, BudgetWindow(*key)))
        return windows
