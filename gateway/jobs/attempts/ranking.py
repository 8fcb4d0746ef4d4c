"""The ranking of an attempt group: a pure function of the evidence the gateway gathered.

The rule (issue 39; docs/attempts.md states it for users, this module is its one home):

    class 1  completed, changed, check passed
    class 2  completed, changed, no check
    class 3  completed, changed, check failed (a non-zero exit, or none: timed out)
    class 4  completed without changes
    class 5  failed, timed out or cancelled (or still running)

Within a class: applies cleanly to the checkout's current HEAD first, then fewer changed
lines, then lower known cost (unknown last), then shorter duration (unknown last), then
submission order. The winner is the first row of class 1, or of class 2 when the group has
no check; no winner when no attempt qualifies. Nothing here reads a clock, a file or the
store: the same evidence always gives the same order, which is what makes it testable and
what lets a judge's pick be checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PASSED, NO_CHECK, CHECK_FAILED, UNCHANGED, NOT_COMPLETED = 1, 2, 3, 4, 5
CLASS_NAMES = {
    PASSED: "check passed", NO_CHECK: "changed, no check", CHECK_FAILED: "check failed",
    UNCHANGED: "no changes", NOT_COMPLETED: "did not complete",
}


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the ranking reads of one attempt."""

    job_id: str
    ordinal: int  # submission order
    completed: bool  # the job's status is `completed`
    changed: bool  # it committed changes to its branch
    check_exit_code: int | None = None
    check_ran: bool = False  # its check ran to a result (an exit code, or a timeout)
    applies_cleanly: bool | None = None  # None: unknown (counts as not applying)
    changed_lines: int = 0  # insertions + deletions
    cost_usd: float | None = None
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class Ranked:
    evidence: Evidence
    rank: int  # the class, 1..5


@dataclass(frozen=True, slots=True)
class Ranking:
    rows: tuple[Ranked, ...]  # best first
    winner: str | None  # a job id
    reason: str | None  # one line: why the winner won, or why there is none


def rank_class(evidence: Evidence) -> int:
    if not evidence.completed:
        return NOT_COMPLETED
    if not evidence.changed:
        return UNCHANGED
    if not evidence.check_ran:
        return NO_CHECK
    return PASSED if evidence.check_exit_code == 0 else CHECK_FAILED


def _order_key(row: Ranked) -> tuple[int, bool, int, float, float, int]:
    evidence = row.evidence
    return (row.rank, evidence.applies_cleanly is not True, evidence.changed_lines,
            _known_or_last(evidence.cost_usd), _known_or_last(evidence.duration_s),
            evidence.ordinal)


def _known_or_last(value: float | None) -> float:
    return math.inf if value is None else value


def rank(attempts: Sequence[Evidence], *, has_check: bool) -> Ranking:
    """The group's rows best first, with the winner and a one-line reason."""
    rows = tuple(sorted((Ranked(e, rank_class(e)) for e in attempts), key=_order_key))
    wanted = PASSED if has_check else NO_CHECK
    qualifying = [row for row in rows if row.rank == wanted]
    if not qualifying:
        why = ("no attempt completed with changes that pass the check" if has_check
               else "no attempt completed with changes")
        return Ranking(rows, None, why)
    best = qualifying[0]
    return Ranking(rows, best.evidence.job_id, _reason(best, qualifying, has_check))


def _reason(best: Ranked, qualifying: Sequence[Ranked], has_check: bool) -> str:
    """Why `best` won, naming the first tie-break that set it apart from the runner-up."""
    head = "check passed" if has_check else "completed with changes (no check)"
    if len(qualifying) == 1:
        return f"{head}; the only attempt that did"
    runner_up = qualifying[1].evidence
    e = best.evidence
    if (e.applies_cleanly is True) != (runner_up.applies_cleanly is True):
        return f"{head}; applies cleanly to HEAD, the next one does not"
    if e.changed_lines != runner_up.changed_lines:
        return f"{head}; fewest changed lines ({e.changed_lines} vs {runner_up.changed_lines})"
    if _known_or_last(e.cost_usd) != _known_or_last(runner_up.cost_usd):
        return f"{head}; lowest known cost (${e.cost_usd:.4f})"
    if _known_or_last(e.duration_s) != _known_or_last(runner_up.duration_s):
        return f"{head}; shortest duration ({e.duration_s:.1f}s)"
    return f"{head}; tied with the next one, submitted first"
