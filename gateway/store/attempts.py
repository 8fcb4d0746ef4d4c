"""Attempt groups (issue 39, DESIGN.md section 9): the rows every backend keeps for them.

A group is one prompt given to N attempts, each an ordinary job in its own worktree from one
`base_sha`. The store keeps two things besides those jobs: the group row (what was asked,
its dedup key, where it stands, the pick) and one attempt row per job (its place in the group
and its check). Both change only by compare-and-set: the WHERE clause of each transition is
the invariant (`sqlite/attempts.py` states each), so of any number of gateways racing on one
group or one check exactly one wins.

The check's life, per attempt: `pending` (admitted) -> `running` (claimed by the one gateway
that runs it, `claim_check`) -> `done` (its result, `record_check`); or `pending` ->
`skipped` (it will never run: no check, no changes, the attempt failed; the reason says which).
A group's: `running` -> `done` (every attempt ended and was checked) -> `picked` |
`discarded`; a pick or a discard may also end a group that still runs.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Times are epoch seconds on the store's clock (PostgreSQL: the database's), as floats: a
# group's durations are differences of them and nothing compares them with a wall clock.


DEFAULT_CHECK_TIMEOUT_S = 600  # a group's check_timeout_s when the call gives none
MAX_CHECK_TIMEOUT_S = 24 * 3600  # a check that needs longer is not a check


class GroupStatus(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    PICKED = "picked"
    DISCARDED = "discarded"


class CheckState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"


# A pick or a discard may end a group that is still running (the rest are cancelled) or
# one that is done; never one already picked or discarded.
PICKABLE = (GroupStatus.RUNNING, GroupStatus.DONE)


class DuplicateActiveGroup(Exception):
    """insert_attempt_group lost the race: a running group with the same dedup key exists.
    `existing_id` names it, so admission answers with that group (one group, not two)."""

    def __init__(self, existing_id: str | None) -> None:
        super().__init__(f"a running attempt group with the same key exists: {existing_id}")
        self.existing_id = existing_id


@dataclass(frozen=True, slots=True)
class NewAttemptGroup:
    """What admission writes of a group; its N jobs are NewJobs passed beside it, in
    submission order (an attempt's ordinal is its index there)."""

    group_id: str
    dedup_key: str
    prompt: str
    targets: Sequence[Mapping[str, Any]]  # [{provider, model, count}] as the caller gave them
    base_sha: str
    working_dir: str
    check_argv: Sequence[str] | None
    check_timeout_s: float
    until: str  # "all" | "first_passing"
    judge: Mapping[str, Any] | None
    principal: str | None = None


@dataclass(slots=True)
class AttemptGroupRow:
    group_id: str
    dedup_key: str
    prompt: str
    targets: list[dict[str, Any]]
    base_sha: str
    working_dir: str
    check_argv: list[str] | None
    check_timeout_s: float
    until: str
    judge: dict[str, Any] | None
    status: GroupStatus
    principal: str | None = None
    winner_job_id: str | None = None
    winner_reason: str | None = None
    judge_job_id: str | None = None
    judge_result: dict[str, Any] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    ended_at: float | None = None

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> AttemptGroupRow:
        """A row as every backend reads it: JSON columns as text, times as epoch floats."""
        return cls(
            group_id=row["group_id"], dedup_key=row["dedup_key"], prompt=row["prompt"],
            targets=json.loads(row["targets_json"]), base_sha=row["base_sha"],
            working_dir=row["working_dir"], check_argv=_json_or_none(row["check_json"]),
            check_timeout_s=float(row["check_timeout_s"]), until=row["until_rule"],
            judge=_json_or_none(row["judge_json"]), status=GroupStatus(row["status"]),
            principal=row["principal"], winner_job_id=row["winner_job_id"],
            winner_reason=row["winner_reason"], judge_job_id=row["judge_job_id"],
            judge_result=_json_or_none(row["judge_result_json"]),
            created_at=float(row["created_at"]), updated_at=float(row["updated_at"]),
            ended_at=None if row["ended_at"] is None else float(row["ended_at"]),
        )


@dataclass(slots=True)
class AttemptRow:
    """One attempt of a group: its job and its check."""

    job_id: str
    group_id: str
    ordinal: int  # submission order, from 0: the last tie-break of the ranking
    check_state: CheckState
    check_claimed_by: str | None = None  # the instance that runs (or ran) the check
    check_exit_code: int | None = None
    check_output_tail: str | None = None
    check_duration_s: float | None = None
    check_reason: str | None = None  # why it was skipped, or why it has no exit code
    check_started_at: float | None = None
    check_ended_at: float | None = None

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> AttemptRow:
        return cls(
            job_id=row["job_id"], group_id=row["group_id"], ordinal=int(row["ordinal"]),
            check_state=CheckState(row["check_state"]),
            check_claimed_by=row["check_claimed_by"],
            check_exit_code=row["check_exit_code"],
            check_output_tail=row["check_output_tail"],
            check_duration_s=row["check_duration_s"], check_reason=row["check_reason"],
            check_started_at=row["check_started_at"], check_ended_at=row["check_ended_at"],
        )


@dataclass(frozen=True, slots=True)
class CheckResult:
    """How a check ended: its exit code (None: it has none, `reason` says why: `timeout`,
    `interrupted`, `spawn_failed: ...`), the tail of its output, how long it ran."""

    exit_code: int | None
    output_tail: str
    duration_s: float
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class GroupEnd:
    """A group transition (end_attempt_group): from one of `expected` to `status`, with
    the winner (or None) and its one-line reason."""

    group_id: str
    expected: tuple[GroupStatus, ...]
    status: GroupStatus
    winner_job_id: str | None = None
    winner_reason: str | None = None
    judge_job_id: str | None = None
    judge_result: Mapping[str, Any] | None = field(default=None)


def group_params(group: NewAttemptGroup) -> dict[str, Any]:
    """The group's columns as every backend binds them (JSON columns as compact text)."""
    return {
        "group_id": group.group_id, "dedup_key": group.dedup_key, "prompt": group.prompt,
        "targets_json": _dumps([dict(t) for t in group.targets]),
        "base_sha": group.base_sha, "working_dir": group.working_dir,
        "check_json": None if group.check_argv is None else _dumps(list(group.check_argv)),
        "check_timeout_s": float(group.check_timeout_s), "until_rule": group.until,
        "judge_json": None if group.judge is None else _dumps(dict(group.judge)),
        "principal": group.principal,
    }


def end_params(end: GroupEnd) -> dict[str, Any]:
    return {
        "group_id": end.group_id, "status": end.status.value,
        "expected": _dumps([status.value for status in end.expected]),
        "winner_job_id": end.winner_job_id, "winner_reason": end.winner_reason,
        "judge_job_id": end.judge_job_id,
        "judge_result_json": None if end.judge_result is None else _dumps(
            dict(end.judge_result)),
        "final": end.status is not GroupStatus.RUNNING,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _json_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)
