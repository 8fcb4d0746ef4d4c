"""The memory store's attempt groups: the rules of sqlite/attempts.py held in dicts.

MemoryJobStore calls these under its one lock, so each is as atomic as one SQL statement;
each check below is the WHERE clause of the SQL backends' statement (which states why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    CheckState,
    DuplicateActiveGroup,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
    group_params,
)
from gateway.store.memory.outbox import MemoryOutbox
from gateway.store.outbox import NOTIFIED_GROUP_STATUSES


@dataclass(slots=True)
class MemoryAttempts:
    """The two tables of schema version 12, for one process."""

    groups: dict[str, AttemptGroupRow] = field(default_factory=dict)
    attempts: dict[str, AttemptRow] = field(default_factory=dict)  # job id -> attempt

    def insert(self, group: NewAttemptGroup, job_ids: Sequence[str],
               now: float) -> AttemptGroupRow:
        if group.group_id in self.groups:
            raise ValueError(f"group id {group.group_id} already exists")
        for other in self.groups.values():  # the partial unique index's rule
            if other.dedup_key == group.dedup_key and other.status is GroupStatus.RUNNING:
                raise DuplicateActiveGroup(other.group_id)
        row = AttemptGroupRow.from_mapping({
            **group_params(group), "status": GroupStatus.RUNNING.value,
            "winner_job_id": None, "winner_reason": None, "judge_job_id": None,
            "judge_result_json": None, "created_at": now, "updated_at": now,
            "ended_at": None})
        self.groups[group.group_id] = row
        for ordinal, job_id in enumerate(job_ids):
            self.attempts[job_id] = AttemptRow(job_id, group.group_id, ordinal,
                                               CheckState.PENDING)
        return replace(row)

    def forget(self, group_id: str) -> None:
        """Undo an insert whose jobs were refused (admission is all or nothing)."""
        self.groups.pop(group_id, None)
        for job_id in [a.job_id for a in self.attempts.values() if a.group_id == group_id]:
            del self.attempts[job_id]

    def find(self, dedup_key: str, window_s: float, now: float) -> AttemptGroupRow | None:
        found = [g for g in self.groups.values() if g.dedup_key == dedup_key and (
            g.status is GroupStatus.RUNNING or (
                g.status is GroupStatus.DONE and g.ended_at is not None
                and g.ended_at >= now - window_s))]
        found.sort(key=lambda g: (g.created_at, g.group_id), reverse=True)
        return replace(found[0]) if found else None

    def get(self, group_id: str) -> AttemptGroupRow | None:
        row = self.groups.get(group_id)
        return replace(row) if row is not None else None

    def newest(self, principal: str | None, status: GroupStatus | None,
               limit: int) -> list[AttemptGroupRow]:
        rows = [g for g in self.groups.values()
                if (principal is None or g.principal == principal)
                and (status is None or g.status is status)]
        rows.sort(key=lambda g: (g.created_at, g.group_id), reverse=True)
        return [replace(g) for g in rows[:limit]]

    def attempts_of(self, group_id: str) -> list[AttemptRow]:
        rows = [a for a in self.attempts.values() if a.group_id == group_id]
        return [replace(a) for a in sorted(rows, key=lambda a: a.ordinal)]

    def attempt(self, job_id: str) -> AttemptRow | None:
        row = self.attempts.get(job_id)
        return replace(row) if row is not None else None

    def claim_check(self, job_id: str, claimer: str, now: float) -> bool:
        row = self.attempts.get(job_id)
        if row is None or row.check_state is not CheckState.PENDING:
            return False
        row.check_state, row.check_claimed_by, row.check_started_at = (
            CheckState.RUNNING, claimer, now)
        return True

    def skip_check(self, job_id: str, reason: str, now: float) -> bool:
        row = self.attempts.get(job_id)
        if row is None or row.check_state is not CheckState.PENDING:
            return False
        row.check_state, row.check_reason, row.check_ended_at = CheckState.SKIPPED, reason, now
        return True

    def record_check(self, job_id: str, result: CheckResult, now: float) -> bool:
        row = self.attempts.get(job_id)
        if row is None or row.check_state is not CheckState.RUNNING:
            return False
        row.check_state = CheckState.DONE
        row.check_exit_code, row.check_output_tail = result.exit_code, result.output_tail
        row.check_duration_s, row.check_reason = result.duration_s, result.reason
        row.check_ended_at = now
        return True

    def end(self, end: GroupEnd, now: float, outbox: MemoryOutbox) -> bool:
        """The group's move and, to a notified status, its notice (under the store's lock:
        both or neither)."""
        row = self.groups.get(end.group_id)
        if row is None or row.status not in end.expected:
            return False
        if end.judge_job_id is not None and row.judge_job_id not in (None, end.judge_job_id):
            return False  # one judge per group: judge_job_id is set once
        row.status, row.updated_at = end.status, now
        row.winner_job_id = end.winner_job_id or row.winner_job_id
        row.winner_reason = end.winner_reason or row.winner_reason
        row.judge_job_id = end.judge_job_id or row.judge_job_id
        if end.judge_result is not None:
            row.judge_result = dict(end.judge_result)
        if end.status is not GroupStatus.RUNNING and row.ended_at is None:
            row.ended_at = now
        if end.status in NOTIFIED_GROUP_STATUSES:
            outbox.add_group(row, datetime.fromtimestamp(now, UTC))
        return True
