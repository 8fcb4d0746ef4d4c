"""The ranking rule of attempt groups (gateway/jobs/attempts/ranking.py), exhaustively: each
class, each tie-break in its order, the winner and its reason, and that the order does not
depend on the order the evidence came in."""

from __future__ import annotations

import itertools

import pytest

from gateway.jobs.attempts.ranking import (
    CHECK_FAILED,
    NO_CHECK,
    NOT_COMPLETED,
    PASSED,
    UNCHANGED,
    Evidence,
    rank,
    rank_class,
)


def ev(job_id: str, ordinal: int, **changes: object) -> Evidence:
    fields: dict[str, object] = {"completed": True, "changed": True, "check_ran": True,
                                 "check_exit_code": 0, "applies_cleanly": True,
                                 "changed_lines": 10, "cost_usd": 0.1, "duration_s": 5.0}
    fields.update(changes)
    return Evidence(job_id=job_id, ordinal=ordinal, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, PASSED),
    ({"check_ran": False, "check_exit_code": None}, NO_CHECK),
    ({"check_exit_code": 1}, CHECK_FAILED),
    ({"check_exit_code": None}, CHECK_FAILED),  # ran, no exit code: timed out
    ({"changed": False}, UNCHANGED),
    ({"changed": False, "check_ran": False}, UNCHANGED),
    ({"completed": False}, NOT_COMPLETED),
    ({"completed": False, "changed": False}, NOT_COMPLETED),
])
def test_each_class(changes: dict[str, object], expected: int) -> None:
    assert rank_class(ev("a", 0, **changes)) == expected


def test_correct_wrong_and_empty_attempts_rank_one_three_four() -> None:
    attempts = [ev("nothing", 0, changed=False, check_ran=False, check_exit_code=None),
                ev("wrong", 1, check_exit_code=1), ev("right", 2)]
    ranking = rank(attempts, has_check=True)
    assert [(r.evidence.job_id, r.rank) for r in ranking.rows] == [
        ("right", 1), ("wrong", 3), ("nothing", 4)]
    assert ranking.winner == "right"
    assert ranking.reason == "check passed; the only attempt that did"


def test_the_classes_come_in_order_whatever_the_tie_breaks_say() -> None:
    attempts = [ev("failed", 0, completed=False, changed_lines=0, cost_usd=0.0),
                ev("unchanged", 1, changed=False, changed_lines=0),
                ev("check-failed", 2, check_exit_code=2, changed_lines=1),
                ev("no-check", 3, check_ran=False, check_exit_code=None, changed_lines=1),
                ev("passed", 4, applies_cleanly=False, changed_lines=900, cost_usd=None)]
    for permutation in itertools.permutations(attempts):
        ranking = rank(list(permutation), has_check=True)
        assert [r.evidence.job_id for r in ranking.rows] == [
            "passed", "no-check", "check-failed", "unchanged", "failed"]
        assert [r.rank for r in ranking.rows] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("better", "worse", "reason"), [
    ({"applies_cleanly": True, "changed_lines": 99},
     {"applies_cleanly": False, "changed_lines": 1},
     "check passed; applies cleanly to HEAD, the next one does not"),
    ({"applies_cleanly": True}, {"applies_cleanly": None},
     "check passed; applies cleanly to HEAD, the next one does not"),
    ({"changed_lines": 3, "cost_usd": 9.0}, {"changed_lines": 4, "cost_usd": 0.0},
     "check passed; fewest changed lines (3 vs 4)"),
    ({"cost_usd": 0.5, "duration_s": 99.0}, {"cost_usd": 0.75, "duration_s": 1.0},
     "check passed; lowest known cost ($0.5000)"),
    ({"cost_usd": 100.0}, {"cost_usd": None},
     "check passed; lowest known cost ($100.0000)"),
    ({"duration_s": 2.0}, {"duration_s": 3.0}, "check passed; shortest duration (2.0s)"),
    ({"duration_s": 1000.0}, {"duration_s": None}, "check passed; shortest duration (1000.0s)"),
])
def test_each_tie_break_in_its_order(better: dict[str, object], worse: dict[str, object],
                                     reason: str) -> None:
    # The worse one was submitted first: only the tie-break under test can put it second.
    for attempts in ([ev("worse", 0, **worse), ev("better", 1, **better)],
                     [ev("better", 1, **better), ev("worse", 0, **worse)]):
        ranking = rank(attempts, has_check=True)
        assert [r.evidence.job_id for r in ranking.rows] == ["better", "worse"]
        assert (ranking.winner, ranking.reason) == ("better", reason)


def test_a_full_tie_goes_to_submission_order() -> None:
    ranking = rank([ev("second", 1), ev("first", 0)], has_check=True)
    assert [r.evidence.job_id for r in ranking.rows] == ["first", "second"]
    assert ranking.reason == "check passed; tied with the next one, submitted first"


def test_tie_breaks_apply_within_every_class() -> None:
    attempts = [ev("slow-fail", 0, check_exit_code=1, duration_s=9.0),
                ev("fast-fail", 1, check_exit_code=1, duration_s=1.0),
                ev("late-none", 3, changed=False), ev("early-none", 2, changed=False),
                ev("big-crash", 4, completed=False, changed_lines=50),
                ev("small-crash", 5, completed=False, changed_lines=5)]
    ranking = rank(attempts, has_check=True)
    assert [r.evidence.job_id for r in ranking.rows] == [
        "fast-fail", "slow-fail", "early-none", "late-none", "small-crash", "big-crash"]
    assert ranking.winner is None
    assert ranking.reason == "no attempt completed with changes that pass the check"


def test_without_a_check_the_winner_is_the_first_changed_attempt() -> None:
    attempts = [ev("none", 0, changed=False, check_ran=False, check_exit_code=None),
                ev("big", 1, check_ran=False, check_exit_code=None, changed_lines=40),
                ev("small", 2, check_ran=False, check_exit_code=None, changed_lines=4)]
    ranking = rank(attempts, has_check=False)
    assert [r.rank for r in ranking.rows] == [2, 2, 4]
    assert ranking.winner == "small"
    assert ranking.reason == "completed with changes (no check); fewest changed lines (4 vs 40)"


def test_with_a_check_an_unchecked_attempt_never_wins() -> None:
    ranking = rank([ev("unchecked", 0, check_ran=False, check_exit_code=None)], has_check=True)
    assert ranking.winner is None


def test_no_attempt_completed_with_changes() -> None:
    ranking = rank([ev("a", 0, completed=False), ev("b", 1, changed=False)], has_check=False)
    assert ranking.winner is None
    assert ranking.reason == "no attempt completed with changes"
    assert rank([], has_check=True).rows == ()
