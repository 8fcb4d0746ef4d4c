"""The memory backend's completion-notice outbox (store/outbox.py): the rules the SQL of
the other backends states, over a dict, under the store's one lock (the caller holds it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime, timedelta

from gateway.model import JobRow
from gateway.store.attempts import AttemptGroupRow
from gateway.store.outbox import NOTICE_ERROR_CHARS, Notice, Settlement, group_notice


class MemoryOutbox:
    """Notices by id, in insertion order."""

    def __init__(self) -> None:
        self._notices: dict[str, Notice] = {}

    def add(self, jobs: Iterable[JobRow], now: datetime, cost_usd: float | None = None) -> None:
        """One notice per terminal state of each job: a second add of the same one is a
        no-op (the id is `<job id>:<status>`)."""
        for job in jobs:
            if job.status.is_active:
                continue
            notice_id = f"{job.id}:{job.status}"
            if notice_id in self._notices:
                continue
            began = job.started_at or job.created_at
            duration = (max((job.finished_at - began).total_seconds(), 0.0)
                        if job.finished_at and began else None)
            self._notices[notice_id] = Notice(
                id=notice_id, job_id=job.id, provider=job.provider, status=str(job.status),
                error_kind=job.error_kind,
                error=job.error[:NOTICE_ERROR_CHARS] if job.error else None,
                duration_s=duration, cost_usd=cost_usd, created_at=now, next_attempt_at=now)

    def add_group(self, group: AttemptGroupRow, now: datetime) -> None:
        """The notice of a group's end (store/outbox.py): a second add is a no-op."""
        notice = group_notice(group, now)
        self._notices.setdefault(notice.id, notice)

    def claim(self, instance_id: str, lease_s: float, limit: int, now: datetime) -> list[Notice]:
        due = sorted((n for n in self._notices.values() if _claimable(n, now)),
                     key=lambda n: n.next_attempt_at or now)[:max(limit, 0)]
        for notice in due:
            notice.claimed_by = instance_id
            notice.claim_expires_at = now + timedelta(seconds=lease_s)
            notice.attempts += 1
        return [dataclasses.replace(n, sinks_done=list(n.sinks_done)) for n in due]

    def record_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        notice = self._notices.get(notice_id)
        if notice is None or not _held(notice, instance_id):
            return False
        if sink not in notice.sinks_done:
            notice.sinks_done.append(sink)
        return True

    def settle(self, notice_id: str, instance_id: str, outcome: Settlement,
               retry_in_s: float, error: str | None, now: datetime) -> bool:
        notice = self._notices.get(notice_id)
        if notice is None or not _held(notice, instance_id):
            return False
        notice.last_error = error
        if outcome == "retry":
            notice.claimed_by = None
            notice.claim_expires_at = None
            notice.next_attempt_at = now + timedelta(seconds=retry_in_s)
            return True
        notice.outcome = outcome
        notice.claim_expires_at = None
        if outcome == "failed":
            notice.failed_at = now
        else:
            notice.delivered_at = now
        return True

    def listed(self, failed_only: bool, limit: int) -> list[Notice]:
        rows = [n for n in reversed(self._notices.values())
                if not failed_only or n.failed_at is not None]
        return [dataclasses.replace(n, sinks_done=list(n.sinks_done))
                for n in rows[:max(limit, 0)]]

    def count_failed(self) -> int:
        return sum(1 for n in self._notices.values() if n.failed_at is not None)

    def purge(self, job_ids: Iterable[str]) -> None:
        gone = set(job_ids)
        for notice_id in [k for k, n in self._notices.items() if n.job_id in gone]:
            del self._notices[notice_id]


def _claimable(notice: Notice, now: datetime) -> bool:
    """Invariant (CLAIM_NOTICES): undelivered, unfailed, due, and unclaimed or lapsed."""
    return (notice.delivered_at is None and notice.failed_at is None
            and (notice.next_attempt_at is None or notice.next_attempt_at <= now)
            and (notice.claim_expires_at is None or notice.claim_expires_at < now))


def _held(notice: Notice, instance_id: str) -> bool:
    """Invariant (SETTLE, RECORD_SINK): the claim is this deliverer's and still open."""
    return (notice.claimed_by == instance_id and notice.delivered_at is None
            and notice.failed_at is None)
