"""Usage totals and budgets (issue 28) on every backend: the same bodies on memory, SQLite and
PostgreSQL (tests/store/conftest.py), including admissions racing on two connections to the
same storage. Money is whole micro-dollars, so sums of cents are exact."""

from __future__ import annotations

import dataclasses
import uuid

import anyio
import pytest

from gateway.model import Completion, JobStatus, NewJob, Reservation, UsageFigures
from gateway.store.base import JobStore
from gateway.store.usage import BudgetExceeded, UsageRow, window_of, window_resets_at
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

OWNER = "instance-a"
TTL_S = 60.0
QUARTER = 250_000  # $0.25 in micro-dollars
DOLLAR = 1_000_000
CLAUDE_DAILY = "providers.claude.daily_usd"


def new_job(provider: str = "claude", model: str | None = "model-x",
            reservations: tuple[Reservation, ...] = ()) -> NewJob:
    job_id = str(uuid.uuid4())
    return NewJob(id=job_id, provider=provider, request_key=f"key-{job_id}",
                  owner_instance=OWNER, model=model, reservations=reservations)


def daily(amount: int = QUARTER, limit: int = DOLLAR, budget: str = CLAUDE_DAILY) -> Reservation:
    return Reservation(budget=budget, period="day", unit="usd", amount=amount, limit=limit)


def finished(usage: UsageFigures | None) -> Completion:
    return Completion(status=JobStatus.COMPLETED, exit_code=0, usage=usage)


def reported(cost: float | None, tokens_in: int | None = 100, tokens_out: int | None = 50,
             model: str | None = None, source: str = "reported") -> UsageFigures:
    return UsageFigures(cost_source=source, model=model, input_tokens=tokens_in,
                        output_tokens=tokens_out, cost_usd=cost)


async def run_job(store: JobStore, job: NewJob, usage: UsageFigures | None) -> None:
    await store.insert_job(job, TTL_S)
    assert await store.complete(job.id, OWNER, finished(usage))


def by_key(rows: list[UsageRow]) -> dict[tuple[str, str], UsageRow]:
    return {(r.key, r.cost_source): r for r in rows}


async def test_usage_totals_sum_each_job_once_and_keep_missing_figures_absent(
        store: JobStore) -> None:
    for _ in range(3):
        await run_job(store, new_job(), reported(0.25))
    await run_job(store, new_job("codex", "gpt-x"), reported(None, 1000, 10, source="absent"))
    await run_job(store, new_job("grok"), None)
    # a second terminal write of a job that ended changes nothing, the totals included
    repeat = new_job()
    await run_job(store, repeat, reported(0.25))
    assert not await store.complete(repeat.id, OWNER, finished(reported(9.0)))

    rows = by_key(await store.usage_totals("provider"))
    claude = rows[("claude", "reported")]
    assert (claude.jobs, claude.input_tokens, claude.output_tokens) == (4, 400, 200)
    assert claude.cost_micro_usd == 4 * QUARTER and claude.cache_read_tokens is None
    codex = rows[("codex", "absent")]
    assert (codex.jobs, codex.input_tokens, codex.cost_micro_usd) == (1, 1000, None)
    assert rows[("grok", "none")].jobs == 1 and rows[("grok", "none")].input_tokens is None

    models = by_key(await store.usage_totals("model"))
    assert models[("model-x", "reported")].jobs == 4  # the job's own model: none reported
    assert models[("gpt-x", "absent")].jobs == 1
    today = window_of("day", await store.now())
    days = await store.usage_totals("day", since_day=today, until_day=today)
    assert sum(r.jobs for r in days) == 6 and {r.key for r in days} == {today}
    assert await store.usage_totals("day", until_day="2000-01-01") == []


async def test_a_reported_model_groups_before_the_jobs_own(store: JobStore) -> None:
    await run_job(store, new_job(model=None), reported(0.01, model="claude-sonnet-5"))
    await run_job(store, new_job(model=None), reported(0.01))
    models = by_key(await store.usage_totals("model"))
    assert models[("claude-sonnet-5", "reported")].jobs == 1
    assert models[("", "reported")].jobs == 1


async def test_a_reservation_is_held_then_settled_with_the_real_cost(store: JobStore) -> None:
    job = new_job(reservations=(daily(),))
    await store.insert_job(job, TTL_S)
    (held,) = await store.budget_windows([(CLAUDE_DAILY, "day")])
    assert (held.spent, held.reserved) == (0, QUARTER)
    assert await store.complete(job.id, OWNER, finished(reported(0.1)))
    (settled,) = await store.budget_windows([(CLAUDE_DAILY, "day")])
    assert (settled.spent, settled.reserved) == (100_000, 0)
    assert settled.window_start == window_of("day", await store.now())


async def test_admission_past_a_limit_is_refused_and_writes_nothing(store: JobStore) -> None:
    for _ in range(4):
        await store.insert_job(new_job(reservations=(daily(),)), TTL_S)
    refused = new_job(reservations=(daily(budget="daily_usd", limit=10 * DOLLAR), daily()))
    with pytest.raises(BudgetExceeded) as caught:
        await store.insert_job(refused, TTL_S)
    assert caught.value.reservation.budget == CLAUDE_DAILY
    assert (caught.value.window.spent, caught.value.window.reserved) == (0, DOLLAR)
    assert await store.get_job(refused.id) is None
    # the budget reserved before the refusing one was rolled back with it
    (overall,) = await store.budget_windows([("daily_usd", "day")])
    assert overall.reserved == 0
    with pytest.raises(BudgetExceeded):  # an amount larger than the limit, on a new window
        await store.insert_job(new_job(reservations=(daily(2 * DOLLAR, budget="b2"),)), TTL_S)


async def test_a_job_count_budget_spends_one_job_per_admission(store: JobStore) -> None:
    count = Reservation(budget="providers.codex.max_jobs_per_day", period="day", unit="jobs",
                        amount=1, limit=2)
    for _ in range(2):
        await run_job(store, new_job("codex", reservations=(count,)), None)
    with pytest.raises(BudgetExceeded):
        await store.insert_job(new_job("codex", reservations=(count,)), TTL_S)
    (window,) = await store.budget_windows([(count.budget, "day")])
    assert (window.spent, window.reserved) == (2, 0)


async def test_the_sweeper_releases_only_reservations_of_jobs_that_ended_without_one(
        store: JobStore) -> None:
    active = new_job(reservations=(daily(),))
    await store.insert_job(active, TTL_S)
    ended = new_job(reservations=(daily(),))
    await store.insert_job(ended, -5.0)  # a lease already over: the reaper orphans it
    flipped = await store.recover_expired_leases(
        60.0, [r.id for r in await store.list_expired_candidates(60.0)])
    assert [r.id for r in flipped] == [ended.id]
    assert await store.release_reservations() == 1
    assert await store.release_reservations() == 0
    (window,) = await store.budget_windows([(CLAUDE_DAILY, "day")])
    assert (window.spent, window.reserved) == (0, QUARTER)


async def test_racing_admissions_on_two_connections_never_pass_the_limit(
        store: JobStore, second_store: JobStore) -> None:
    admitted: list[str] = []
    refused: list[BudgetExceeded] = []

    async def admit(target: JobStore) -> None:
        job = new_job(reservations=(daily(budget="daily_usd", limit=100 * DOLLAR), daily()))
        try:
            await target.insert_job(job, TTL_S)
            admitted.append(job.id)
        except BudgetExceeded as exc:
            refused.append(exc)

    with anyio.fail_after(scaled(60)):
        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(admit, store if n % 2 else second_store)
    assert len(admitted) == 4 and len(refused) == 8
    claude, overall = await store.budget_windows([(CLAUDE_DAILY, "day"), ("daily_usd", "day")])
    assert (claude.reserved, overall.reserved) == (DOLLAR, DOLLAR)


def test_windows_reset_at_the_next_utc_day_and_month() -> None:
    assert window_resets_at("day", "2026-12-31").isoformat() == "2027-01-01T00:00:00+00:00"
    assert window_resets_at("month", "2026-12").isoformat() == "2027-01-01T00:00:00+00:00"
    assert window_resets_at("month", "2026-02").isoformat() == "2026-03-01T00:00:00+00:00"
    assert window_of("month", 0) == "1970-01" and window_of("day", 86_399) == "1970-01-01"


async def test_usage_figures_round_to_whole_micro_dollars(store: JobStore) -> None:
    for cost in (0.1, 0.2):
        await run_job(store, new_job(provider="mistral"), reported(cost))
    (row,) = await store.usage_totals("provider")
    assert row.cost_micro_usd == 300_000
    assert dataclasses.replace(row, key="x").jobs == 2
