"""Attempt groups (issue 39) on every backend: a group is admitted whole or not at all (its
jobs, their budget reservations, its attempt rows), an identical running group is joined
(racing admissions make one group), a check is claimed once and has one result, and a group
moves only from the status its caller read."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.model import JobStatus, NewJob, Reservation
from gateway.store.attempts import (
    CheckResult,
    CheckState,
    DuplicateActiveGroup,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.base import DuplicateActiveJob, JobStore
from gateway.store.usage import BudgetExceeded

pytestmark = pytest.mark.anyio

OWNER = "instance-a"
TTL_S = 60.0
QUARTER = 250_000  # $0.25 in micro-dollars


def group(key: str | None = None, **changes: object) -> NewAttemptGroup:
    fields: dict[str, object] = {
        "group_id": str(uuid.uuid4()), "dedup_key": key or f"group-{uuid.uuid4().hex}",
        "prompt": "fix the failing test",
        "targets": [{"provider": "claude", "count": 2}, {"provider": "codex"}],
        "base_sha": "a" * 40, "working_dir": "/tmp/repo", "check_argv": ["pytest", "-q"],
        "check_timeout_s": 600.0, "until": "all", "judge": None, "principal": "alice",
        **changes}
    return NewAttemptGroup(**fields)  # type: ignore[arg-type]


def attempt_jobs(count: int = 3, reservations: tuple[Reservation, ...] = ()) -> list[NewJob]:
    jobs = []
    for _ in range(count):
        job_id = str(uuid.uuid4())
        jobs.append(NewJob(id=job_id, provider="claude", request_key=f"attempt-{job_id}",
                           owner_instance=OWNER, reservations=reservations))
    return jobs


def budget(limit: int) -> Reservation:
    name = f"providers.claude.daily_usd.{uuid.uuid4().hex[:8]}"  # a window of its own
    return Reservation(budget=name, period="day", unit="usd", amount=QUARTER, limit=limit)


async def test_a_group_is_admitted_with_its_jobs_and_attempt_rows_in_order(
        store: JobStore) -> None:
    new, jobs = group(judge={"provider": "codex"}), attempt_jobs(3)
    row = await store.insert_attempt_group(new, jobs, TTL_S)
    assert (row.group_id, row.status, row.base_sha) == (new.group_id, GroupStatus.RUNNING,
                                                        "a" * 40)
    assert row.check_argv == ["pytest", "-q"] and row.until == "all"
    assert row.targets == [{"provider": "claude", "count": 2}, {"provider": "codex"}]
    assert row.judge == {"provider": "codex"} and row.winner_job_id is None
    assert await store.get_attempt_group(new.group_id) == row
    attempts = await store.list_attempts(new.group_id)
    assert [a.job_id for a in attempts] == [job.id for job in jobs]
    assert [a.ordinal for a in attempts] == [0, 1, 2]
    assert {a.check_state for a in attempts} == {CheckState.PENDING}
    for job in jobs:
        stored = await store.get_job(job.id, with_output=False)
        assert stored is not None and stored.status is JobStatus.QUEUED
    assert await store.get_attempt(jobs[1].id) == attempts[1]
    assert await store.get_attempt(str(uuid.uuid4())) is None


async def test_a_budget_that_fits_two_of_three_refuses_the_whole_group(store: JobStore) -> None:
    held = budget(limit=2 * QUARTER)  # two attempts fit, the third does not
    new, jobs = group(), attempt_jobs(3, (held,))
    with pytest.raises(BudgetExceeded):
        await store.insert_attempt_group(new, jobs, TTL_S)
    assert await store.get_attempt_group(new.group_id) is None
    assert await store.list_attempts(new.group_id) == []
    for job in jobs:
        assert await store.get_job(job.id) is None
    (window,) = await store.budget_windows([(held.budget, "day")])
    assert (window.reserved, window.spent) == (0, 0)  # nothing of the group is held
    # Two attempts fit: admitted, and both reservations are held.
    fitting = attempt_jobs(2, (held,))
    await store.insert_attempt_group(group(), fitting, TTL_S)
    (window,) = await store.budget_windows([(held.budget, "day")])
    assert window.reserved == 2 * QUARTER


async def test_a_job_key_taken_refuses_the_whole_group(store: JobStore) -> None:
    taken = attempt_jobs(1)[0]
    await store.insert_job(taken, TTL_S)
    new, jobs = group(), attempt_jobs(2)
    clash = NewJob(id=str(uuid.uuid4()), provider="claude", request_key=taken.request_key,
                   owner_instance=OWNER)
    with pytest.raises(DuplicateActiveJob):
        await store.insert_attempt_group(new, [*jobs, clash], TTL_S)
    assert await store.get_attempt_group(new.group_id) is None
    assert await store.get_job(jobs[0].id) is None


async def test_an_identical_running_group_is_found_and_a_twin_refused(store: JobStore) -> None:
    first = group()
    await store.insert_attempt_group(first, attempt_jobs(2), TTL_S)
    found = await store.find_attempt_group(first.dedup_key, 60.0)
    assert found is not None and found.group_id == first.group_id
    twin = group(key=first.dedup_key)
    with pytest.raises(DuplicateActiveGroup) as caught:
        await store.insert_attempt_group(twin, attempt_jobs(2), TTL_S)
    assert caught.value.existing_id == first.group_id
    assert await store.get_attempt_group(twin.group_id) is None
    # Once it ended and the window passed (0 s), a new group with that key is admitted.
    assert await store.end_attempt_group(GroupEnd(first.group_id, (GroupStatus.RUNNING,),
                                                  GroupStatus.DONE))
    assert (await store.find_attempt_group(first.dedup_key, 60.0)) is not None  # in window
    assert await store.find_attempt_group(first.dedup_key, -1.0) is None
    await store.insert_attempt_group(twin, attempt_jobs(2), TTL_S)


async def test_racing_identical_admissions_on_several_connections_make_one_group(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(2)]
    key = f"group-{uuid.uuid4().hex}"
    admitted: list[str] = []
    joined: list[str | None] = []

    async def admit(s: JobStore) -> None:
        try:
            row = await s.insert_attempt_group(group(key=key), attempt_jobs(3), TTL_S)
            admitted.append(row.group_id)
        except DuplicateActiveGroup as dup:
            joined.append(dup.existing_id)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(admit, stores[i % len(stores)])
    assert len(admitted) == 1 and len(joined) == 9
    assert set(joined) <= {admitted[0], None}  # None: the winner not yet visible is allowed
    assert len(await stores[0].list_attempts(admitted[0])) == 3


async def test_a_check_is_claimed_once_and_has_one_result(store: JobStore) -> None:
    new, jobs = group(), attempt_jobs(2)
    await store.insert_attempt_group(new, jobs, TTL_S)
    first, second = jobs[0].id, jobs[1].id
    result = CheckResult(exit_code=1, output_tail="1 failed", duration_s=2.5)
    assert not await store.record_check(first, result)  # never claimed: no result
    assert await store.claim_check(first, "gw-1")
    assert not await store.claim_check(first, "gw-2")  # claimed: never twice
    assert not await store.skip_check(first, "no_changes")  # claimed: never skipped
    assert await store.record_check(first, result)
    assert not await store.record_check(first, CheckResult(0, "passed", 1.0))  # one result
    row = await store.get_attempt(first)
    assert row is not None
    assert (row.check_state, row.check_claimed_by, row.check_exit_code) == (
        CheckState.DONE, "gw-1", 1)
    assert (row.check_output_tail, row.check_duration_s) == ("1 failed", 2.5)
    assert row.check_started_at is not None and row.check_ended_at is not None
    assert await store.skip_check(second, "no_changes")
    assert not await store.claim_check(second, "gw-1")  # skipped: never runs
    skipped = await store.get_attempt(second)
    assert skipped is not None
    assert (skipped.check_state, skipped.check_reason) == (CheckState.SKIPPED, "no_changes")


async def test_an_interrupted_check_records_no_exit_code_and_its_reason(store: JobStore) -> None:
    new, jobs = group(), attempt_jobs(2)
    await store.insert_attempt_group(new, jobs, TTL_S)
    assert await store.claim_check(jobs[0].id, "gw-1")
    assert await store.record_check(jobs[0].id, CheckResult(None, "", 600.0, "timeout"))
    row = await store.get_attempt(jobs[0].id)
    assert row is not None and (row.check_exit_code, row.check_reason) == (None, "timeout")


async def test_of_many_racing_claimers_of_one_check_exactly_one_wins(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(3)]
    jobs = attempt_jobs(2)
    await stores[0].insert_attempt_group(group(), jobs, TTL_S)
    wins: list[str] = []

    async def claim(s: JobStore, claimer: str) -> None:
        if await s.claim_check(jobs[0].id, claimer):
            wins.append(claimer)

    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(claim, stores[i % len(stores)], f"gw-{i}")
    assert len(wins) == 1
    row = await stores[0].get_attempt(jobs[0].id)
    assert row is not None and row.check_claimed_by == wins[0]


async def test_a_group_moves_only_from_the_status_its_caller_read(store: JobStore) -> None:
    new, jobs = group(), attempt_jobs(2)
    await store.insert_attempt_group(new, jobs, TTL_S)
    done = GroupEnd(new.group_id, (GroupStatus.RUNNING,), GroupStatus.DONE,
                    winner_job_id=jobs[0].id, winner_reason="check passed, fewest lines",
                    judge_job_id="judge-1", judge_result={"job_id": jobs[0].id})
    assert await store.end_attempt_group(done)
    assert not await store.end_attempt_group(done)  # no longer running
    row = await store.get_attempt_group(new.group_id)
    assert row is not None and row.status is GroupStatus.DONE and row.ended_at is not None
    assert (row.winner_job_id, row.winner_reason) == (jobs[0].id, "check passed, fewest lines")
    assert row.judge_job_id == "judge-1" and row.judge_result == {"job_id": jobs[0].id}
    pick = GroupEnd(new.group_id, (GroupStatus.RUNNING, GroupStatus.DONE), GroupStatus.PICKED,
                    winner_job_id=jobs[1].id)
    discard = GroupEnd(new.group_id, (GroupStatus.RUNNING, GroupStatus.DONE),
                       GroupStatus.DISCARDED)
    assert await store.end_attempt_group(pick)
    assert not await store.end_attempt_group(discard)  # picked is final
    row = await store.get_attempt_group(new.group_id)
    assert row is not None and (row.status, row.winner_job_id) == (GroupStatus.PICKED, jobs[1].id)
    assert row.winner_reason == "check passed, fewest lines"  # kept when not given


async def test_racing_picks_of_one_group_exactly_one_applies(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    stores = [await store_factory() for _ in range(2)]
    new = group()
    await stores[0].insert_attempt_group(new, attempt_jobs(2), TTL_S)
    applied: list[GroupStatus] = []

    async def end(s: JobStore, status: GroupStatus) -> None:
        if await s.end_attempt_group(GroupEnd(new.group_id, (GroupStatus.RUNNING,
                                                             GroupStatus.DONE), status)):
            applied.append(status)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(end, stores[i % 2],
                          GroupStatus.PICKED if i % 2 else GroupStatus.DISCARDED)
    assert len(applied) == 1
    row = await stores[0].get_attempt_group(new.group_id)
    assert row is not None and row.status is applied[0]


async def test_racing_judge_claims_of_one_group_exactly_one_is_set(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    """One judge per group: judge_job_id is set once, whoever races (a running group's
    transition to running that names a judge is the coordinator's claim)."""
    stores = [await store_factory() for _ in range(2)]
    new = group()
    await stores[0].insert_attempt_group(new, attempt_jobs(2), TTL_S)
    claimed: list[str] = []

    async def claim(s: JobStore, judge_id: str) -> None:
        if await s.end_attempt_group(GroupEnd(new.group_id, (GroupStatus.RUNNING,),
                                              GroupStatus.RUNNING, judge_job_id=judge_id)):
            claimed.append(judge_id)

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(claim, stores[i % 2], f"judge-{i}")
    assert len(claimed) == 1
    row = await stores[0].get_attempt_group(new.group_id)
    assert row is not None and row.judge_job_id == claimed[0]
    assert row.status is GroupStatus.RUNNING and row.ended_at is None
    # The same judge again applies (a gateway that joined it); the group then ends with it.
    again = GroupEnd(new.group_id, (GroupStatus.RUNNING,), GroupStatus.DONE,
                     judge_job_id=claimed[0], judge_result={"pick": None, "error": "garbage"})
    assert await stores[1].end_attempt_group(again)
    row = await stores[0].get_attempt_group(new.group_id)
    assert row is not None and row.judge_result == {"pick": None, "error": "garbage"}


async def test_groups_are_listed_newest_first_and_by_principal(store: JobStore) -> None:
    older, newer, other = group(), group(), group(principal="bob")
    for new in (older, newer, other):
        await store.insert_attempt_group(new, attempt_jobs(2), TTL_S)
    mine = await store.list_attempt_groups(principal="alice")
    ids = [row.group_id for row in mine]
    assert older.group_id in ids and newer.group_id in ids and other.group_id not in ids
    assert ids.index(newer.group_id) < ids.index(older.group_id)
    assert len(await store.list_attempt_groups(limit=1)) == 1
    assert await store.end_attempt_group(GroupEnd(older.group_id, (GroupStatus.RUNNING,),
                                                  GroupStatus.DONE))
    running = [row.group_id for row in await store.list_attempt_groups(
        status=GroupStatus.RUNNING)]
    assert newer.group_id in running and older.group_id not in running
