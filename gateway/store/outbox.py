"""The completion-notice outbox (issue 40), as every backend stores it: one notice per job's
terminal write, written in that write's transaction, and the delivery state that lets any
number of gateways deliver it once.

Why an outbox: the terminal write is the only moment every way a job ends has in common (its
gateway, an adopter, a supervisor's finalizer with no gateway alive, the reaper). A notice
written with it cannot be lost by a crash between "ended" and "told", and a deliverer that
dies mid-delivery leaves it claimed only until its claim's lease passes.

A notice's `id` is `<job id>:<status>`: stable, so a sink that sees it twice (at-least-once
after a deliverer died mid-delivery) can deduplicate by it, and one job yields one notice
(a second only when a row orphaned from another host is healed to its real outcome).

Delivery, in the store's terms (the rules of when and where live in gateway/jobs/notify/):
`claim_notices` CASes a due, unclaimed (or lapsed) notice to one deliverer and counts the
attempt; `record_notice_sink` marks one sink done under that claim (a retry skips it);
`settle_notice` ends the claim: delivered, skipped (the `[notify]` filter), retry later, or
failed. Each is a conditional write on the claim, so of any number of racers one wins.

An attempt group's end is told the same way: the write that moves a group to `done` (every
attempt ended and was checked: the comparison is complete) adds the notice
`group:<group id>:done` in its transaction. Its `job_id` is the winner's (the group's id when
there is none), its provider `attempts`, its `error` column the winner's one-line reason, and
it reads with `agent-cli-gateway attempts show <group>`. A pick or a discard is the caller's
own act and adds none (as a cancel is off by default).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gateway.model import JobRow
from gateway.store.attempts import AttemptGroupRow, GroupStatus

# What settle_notice may write: the first two end delivery (delivered_at), `failed` ends it
# too (failed_at), `retry` gives the notice back for a later attempt.
Settlement = Literal["delivered", "skipped", "retry", "failed"]
NOTICE_ERROR_CHARS = 500  # what of a job's error a notice carries: its first line is shown
NOTICE_LIST_LIMIT = 50
CLAIM_BATCH = 20  # notices one deliverer claims at a time: its lease covers them all
GROUP_PREFIX = "group:"  # a group notice's id: group:<group id>:<status>
GROUP_PROVIDER = "attempts"  # a group notice's provider column
NOTIFIED_GROUP_STATUSES = (GroupStatus.DONE,)  # the group ends that add a notice


@dataclass(slots=True)
class Notice:
    """One row of `completion_notices`."""

    id: str
    job_id: str
    provider: str
    status: str
    error_kind: str | None = None
    error: str | None = None
    duration_s: float | None = None
    cost_usd: float | None = None
    created_at: datetime | None = None
    attempts: int = 0
    next_attempt_at: datetime | None = None
    claimed_by: str | None = None
    claim_expires_at: datetime | None = None
    sinks_done: list[str] = field(default_factory=list)
    delivered_at: datetime | None = None
    outcome: str | None = None
    failed_at: datetime | None = None
    last_error: str | None = None

    @classmethod
    def column_names(cls) -> tuple[str, ...]:
        return tuple(cls.__dataclass_fields__)

    @classmethod
    def from_mapping(cls, row: dict[str, Any]) -> Notice:
        values = dict(row)
        done = values.get("sinks_done")
        values["sinks_done"] = json.loads(done) if isinstance(done, str) else list(done or [])
        return cls(**values)

    @property
    def group_id(self) -> str | None:
        """The attempt group this notice tells of (None: a job's notice)."""
        if not self.id.startswith(GROUP_PREFIX):
            return None
        return self.id[len(GROUP_PREFIX):].rsplit(":", 1)[0]

    def payload(self) -> dict[str, Any]:
        """The notice as sinks send it (JSON): stable field names, ISO times."""
        group_id = self.group_id
        if group_id is not None:
            return self._group_payload(group_id)
        first_line = (self.error or "").strip().splitlines()[:1]
        return {
            "id": self.id, "job_id": self.job_id, "provider": self.provider,
            "status": self.status, "error_kind": self.error_kind,
            "error": first_line[0] if first_line else None,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "cost_usd": self.cost_usd,
            "ended_at": self.created_at.isoformat() if self.created_at else None,
            "summary": self.summary(),
            "read_with": f"agent-cli-gateway jobs result {self.job_id}",
        }

    def _group_payload(self, group_id: str) -> dict[str, Any]:
        winner = self.job_id if self.job_id != group_id else None
        return {
            "id": self.id, "group_id": group_id, "job_id": winner,
            "provider": self.provider, "status": self.status, "error_kind": None,
            "error": None, "winner_job_id": winner, "winner_reason": self.error,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "cost_usd": self.cost_usd,
            "ended_at": self.created_at.isoformat() if self.created_at else None,
            "summary": self.summary(),
            "read_with": f"agent-cli-gateway attempts show {group_id}",
        }

    def summary(self) -> str:
        """One line a person reads in a notification."""
        group_id = self.group_id
        if group_id is not None:
            took = "" if self.duration_s is None else f" after {_duration(self.duration_s)}"
            winner = (f"winner {self.job_id[:8]}" + (f" ({self.error[:160]})" if self.error
                                                     else "")
                      if self.job_id != group_id else "no winner")
            return f"attempt group {group_id[:8]} {self.status}{took}: {winner}"
        took = "" if self.duration_s is None else f" after {_duration(self.duration_s)}"
        cost = "" if self.cost_usd is None else f", ${self.cost_usd:.4g}"
        why = ""
        if self.status != "completed":
            first = (self.error or "").strip().splitlines()[:1]
            why = f" ({self.error_kind or 'error'}: {first[0][:160]})" if first else (
                f" ({self.error_kind})" if self.error_kind else "")
        return f"{self.provider} job {self.job_id[:8]} {self.status}{took}{cost}{why}"


def notice_of(row: JobRow) -> Notice:
    """The notice a terminal row makes, as ADD_NOTICES writes it (for a reader that has the
    row in hand: a connected session is told from it without another store read)."""
    began = row.started_at or row.created_at
    duration = (max((row.finished_at - began).total_seconds(), 0.0)
                if row.finished_at is not None and began is not None else None)
    return Notice(id=f"{row.id}:{row.status}", job_id=row.id, provider=row.provider,
                  status=str(row.status), error_kind=row.error_kind,
                  error=row.error[:NOTICE_ERROR_CHARS] if row.error else None,
                  duration_s=duration, created_at=row.finished_at)


def group_notice_id(group_id: str, status: str) -> str:
    return f"{GROUP_PREFIX}{group_id}:{status}"


def group_notice(group: AttemptGroupRow, now: datetime) -> Notice:
    """The notice of a group's end, as the SQL backends' group-notice statements write it
    (the memory backend's, and a reader with the row in hand)."""
    ended = group.ended_at if group.ended_at is not None else group.updated_at
    return Notice(id=group_notice_id(group.group_id, str(group.status)),
                  job_id=group.winner_job_id or group.group_id, provider=GROUP_PROVIDER,
                  status=str(group.status),
                  error=group.winner_reason[:NOTICE_ERROR_CHARS] if group.winner_reason
                  else None,
                  duration_s=max(ended - group.created_at, 0.0), created_at=now,
                  next_attempt_at=now)


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
