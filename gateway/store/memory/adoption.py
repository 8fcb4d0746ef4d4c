"""The memory store's detach, adoption and re-queue methods (the JobRows role's, in
gateway/store/base.py): the rules of the SQL backends' LIST_ADOPTION_CANDIDATES, ADOPT_JOB,
REQUEUE_JOB and EXTEND_LEASES (sqlite/sql.py states why), over the store's dicts.

MemoryJobStore composes this mixin; each method takes the store's one lock (roles.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from gateway.model import ACTIVE_STATUSES, InstanceRow, JobRow, JobStatus
from gateway.store.base import AdoptionCandidate, TakeOver, without_output
from gateway.store.memory.roles import MemoryRole


class MemoryAdoption(MemoryRole):
    """Detach, adoption and re-queue of MemoryJobStore."""

    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        async with self._lock:
            now, count = self._now(), 0
            for job_id, secs in seconds.items():
                job = self._jobs.get(job_id)
                # Invariant: only this instance's running jobs, and never an earlier deadline.
                if job is None or job.owner_instance != instance_id:
                    continue
                if job.status is not JobStatus.RUNNING:
                    continue
                deadline = now + timedelta(seconds=secs)
                job.lease_deadline = max(job.lease_deadline or deadline, deadline)
                job.updated_at = now
                count += 1
            return count

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        async with self._lock:
            now = self._now()
            found = []
            for job in sorted(self._jobs.values(), key=lambda j: (j.created_at or now, j.id)):
                if job.hostname != hostname or job.owner_instance == instance_id:
                    continue
                if not self._settleable(job, now, boot_id, orphaned_within_s):
                    continue
                owner = self._instances.get(job.owner_instance or "")
                if owner is not None and owner.stopped_at is None and not (
                        owner.hostname == hostname and owner.boot_id == boot_id):
                    continue
                light = replace(job, output=None, result_json=None)
                found.append(AdoptionCandidate(job=light,
                                               owner=replace(owner) if owner else None))
            found.sort(key=lambda c: not self._owner_lapsed(c.owner, now))  # stable: oldest
            return found[:max(limit, 0)]

    @staticmethod
    def _owner_lapsed(owner: InstanceRow | None, now: datetime) -> bool:
        """LIST_ADOPTION_CANDIDATES' first sort key: the owner row collected, stopped or
        lapsed."""
        return (owner is None or owner.stopped_at is not None
                or (owner.lease_expires_at is not None and owner.lease_expires_at < now))

    @staticmethod
    def _settleable(job: JobRow, now: datetime, boot_id: str, within_s: float) -> bool:
        """LIST_ADOPTION_CANDIDATES' job predicate (see sqlite/sql.py for the reasons)."""
        if (job.transport == "http" and job.status is JobStatus.RUNNING
                and job.lease_deadline is not None and job.lease_deadline >= now):
            return False
        return job.status in ACTIVE_STATUSES  # `orphaned` is final

    def _taken(self, take: TakeOver) -> JobRow | None:
        """The row if the compare-and-set of a take-over matches it (one winner)."""
        job = self._jobs.get(take.job_id)
        if job is None or job.owner_instance != take.expected_owner:
            return None
        if job.status is not take.expected_status or job.hostname != take.hostname:
            return None
        return job

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        async with self._lock:
            job = self._taken(take)
            if job is None or job.status in (JobStatus.COMPLETED, JobStatus.FAILED,
                                             JobStatus.CANCELLED, JobStatus.TIMED_OUT):
                return None
            if job.status is JobStatus.RUNNING and job.boot_id != take.boot_id:
                return None
            now = self._now()
            job.owner_instance = take.instance_id
            job.updated_at = job.adopted_at = now
            if job.status in ACTIVE_STATUSES:
                deadline = now + timedelta(seconds=take.ttl_s)
                job.lease_deadline = max(job.lease_deadline or deadline, deadline)
            else:
                job.lease_deadline = None
            return without_output(job)

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        async with self._lock:
            job = self._taken(take)
            if job is None or job.cancel_requested_at is not None:
                return None
            if (job.requeued_at is not None and job.transport == "http"
                    and job.started_at is not None):
                return None  # an API call that was made is retried once (REQUEUE_JOB)
            if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.ORPHANED):
                return None
            if not job.forced and any(
                    twin.request_key == job.request_key and twin.id != job.id
                    and not twin.forced and twin.status in ACTIVE_STATUSES
                    for twin in self._jobs.values()):
                return None
            now = self._now()
            job.status, job.owner_instance, job.boot_id = (
                JobStatus.QUEUED, take.instance_id, take.boot_id)
            job.requeued_at = job.updated_at = now
            job.claimed_at = None
            job.requeue_count += 1
            job.requeue_reasons = take.requeue_reasons or job.requeue_reasons
            job.lease_deadline = now + timedelta(seconds=take.ttl_s)
            job.started_at = job.finished_at = None
            job.pid = job.pgid = None
            job.pid_started_at = None
            job.exit_code = None
            job.error = job.error_kind = job.output = job.stderr_tail = None
            job.output_bytes, job.truncated = 0, False
            return without_output(job)
