"""The memory store's AttemptGroups role (gateway/store/protocol_roles.py): its JobStore methods.

MemoryJobStore composes this mixin; each method takes the store's one lock (roles.py) and
hands the rules to MemoryAttempts (attempts.py), which holds the two tables in dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.model import NewJob
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.memory.roles import MemoryRole


class MemoryAttemptGroups(MemoryRole):
    """Attempt groups (issue 39) of MemoryJobStore."""

    async def insert_attempt_group(self, group: NewAttemptGroup, jobs: Sequence[NewJob],
                                   ttl_s: float) -> AttemptGroupRow:
        async with self._lock:
            # Invariant: the group, its N jobs and their reservations, or nothing: what
            # the inserts below change is put back when one of them refuses.
            jobs_before = dict(self._jobs)
            ledger_before = self._ledger.snapshot()
            try:
                row = self._groups.insert(group, [job.id for job in jobs], self.clock())
                for job in jobs:
                    self._insert_job(job, ttl_s)
            except BaseException:
                self._jobs = jobs_before
                self._ledger.restore(ledger_before)
                self._groups.forget(group.group_id)
                raise
            return row

    async def find_attempt_group(self, dedup_key: str,
                                 dedup_window_s: float) -> AttemptGroupRow | None:
        async with self._lock:
            return self._groups.find(dedup_key, dedup_window_s, self.clock())

    async def get_attempt_group(self, group_id: str) -> AttemptGroupRow | None:
        async with self._lock:
            return self._groups.get(group_id)

    async def list_attempt_groups(self, *, principal: str | None = None,
                                  status: GroupStatus | None = None,
                                  limit: int = 50) -> list[AttemptGroupRow]:
        async with self._lock:
            return self._groups.newest(principal, status, limit)

    async def list_attempts(self, group_id: str) -> list[AttemptRow]:
        async with self._lock:
            return self._groups.attempts_of(group_id)

    async def get_attempt(self, job_id: str) -> AttemptRow | None:
        async with self._lock:
            return self._groups.attempt(job_id)

    async def claim_check(self, job_id: str, claimer: str) -> bool:
        async with self._lock:
            return self._groups.claim_check(job_id, claimer, self.clock())

    async def skip_check(self, job_id: str, reason: str) -> bool:
        async with self._lock:
            return self._groups.skip_check(job_id, reason, self.clock())

    async def record_check(self, job_id: str, result: CheckResult) -> bool:
        async with self._lock:
            return self._groups.record_check(job_id, result, self.clock())

    async def end_attempt_group(self, end: GroupEnd) -> bool:
        async with self._lock:
            return self._groups.end(end, self.clock(), self._outbox)
