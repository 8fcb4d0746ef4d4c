"""In-process JobStore: the same rules as SQLite and PostgreSQL, held in two dicts.

For tests and ephemeral runs (`persistence.backend = "memory"`): nothing survives the
process, and only this process can see the jobs. Every method takes one anyio lock for its
whole body, so each call is atomic exactly like one SQL transaction; the checks inside each
method are the same WHERE clauses the SQL backends use (see `sqlite/store.py` for the reasons).
Rows are copied in and out, so a caller can never mutate the stored state by accident.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import anyio

from gateway.model import (
    ACTIVE_STATUSES,
    CANCELLED_ERROR,
    FINAL_STATUSES,
    ORPHANED_ERROR,
    Completion,
    ErrorKind,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    OutputFile,
    Progress,
)
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.base import (
    PREFIX_MATCH_LIMIT,
    REAPER_BATCH_ROWS,
    RETENTION_BATCH_ROWS,
    SCHEMA_VERSION,
    AdoptionCandidate,
    DuplicateActiveJob,
    JobsPage,
    TakeOver,
    WorkerClaim,
    answer_in,
    page_of,
    reaper_row,
    without_output,
)
from gateway.store.memory.attempts import MemoryAttempts
from gateway.store.memory.outbox import MemoryOutbox
from gateway.store.memory.usage import MemoryLedger
from gateway.store.outbox import CLAIM_BATCH, NOTICE_LIST_LIMIT, Notice, Settlement
from gateway.store.usage import BudgetWindow, GroupBy, UsageRow


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


class MemoryJobStore:
    """A dict-backed JobStore for one process (tests, `backend = "memory"`)."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # the store's clock, injectable as SqliteJobStore's
        self._jobs: dict[str, JobRow] = {}
        self._instances: dict[str, InstanceRow] = {}
        self._ledger = MemoryLedger()  # usage totals and budgets (usage.py)
        self._outbox = MemoryOutbox()  # completion notices (outbox.py)
        # One lock for everything: each method is one "transaction".
        self._lock = anyio.Lock()
        self._sweeps: dict[str, tuple[float | None, int]] = {}  # task -> (last claim, runs)
        self._groups = MemoryAttempts()  # attempt groups (attempts.py)

    async def open(self) -> None:
        """Nothing to connect to; present for the protocol."""

    async def close(self) -> None:
        """Nothing to release; the data lives as long as this object."""

    async def schema_version(self) -> int:
        return SCHEMA_VERSION

    async def now(self) -> float:
        return self.clock()

    def _now(self) -> datetime:
        return _utc(self.clock())

    # -- instances -------------------------------------------------------------------------
    async def register_instance(self, instance: InstanceRow, ttl_s: float) -> None:
        async with self._lock:
            now = self._now()
            previous = self._instances.get(instance.instance_id)
            started_at = (
                previous.started_at if previous else (instance.started_at or now)
            )
            # Re-registering (after a heartbeat outage) revives the row: it is not stopped.
            self._instances[instance.instance_id] = replace(
                instance,
                started_at=started_at,
                heartbeat_at=now,
                lease_expires_at=now + timedelta(seconds=ttl_s),
                stopped_at=None,
                renewal_wait_ms_max_1h=(previous.renewal_wait_ms_max_1h if previous
                                        else instance.renewal_wait_ms_max_1h),
                capabilities=(instance.capabilities or
                              (previous.capabilities if previous else None)),
            )

    async def mark_instance_stopped(self, instance_id: str) -> None:
        async with self._lock:
            row = self._instances.get(instance_id)
            if row is not None and row.stopped_at is None:
                row.stopped_at = self._now()

    async def heartbeat(self, instance_id: str, ttl_s: float,
                        renewal_wait_ms: float | None = None) -> int:
        async with self._lock:
            now = self._now()
            deadline = now + timedelta(seconds=ttl_s)
            renewed = 0
            row = self._instances.get(instance_id)
            if row is not None:
                row.heartbeat_at = now
                row.lease_expires_at = deadline
                if renewal_wait_ms is not None:
                    row.renewal_wait_ms_max_1h = renewal_wait_ms
                renewed = 1
            # The instance lease covers all of its jobs (the reaper reads it): one row.
            return renewed

    async def gc_instances(self, older_than_s: float, hostname: str | None = None,
                           keep: Sequence[str] = ()) -> int:
        async with self._lock:
            cutoff = self._now() - timedelta(seconds=older_than_s)
            doomed = [
                key
                for key, row in self._instances.items()
                if (row.stopped_at is not None and row.stopped_at < cutoff)
                or (row.lease_expires_at is not None and row.lease_expires_at < cutoff
                    and hostname in (None, row.hostname) and key not in keep)
            ]
            for key in doomed:
                del self._instances[key]
            return len(doomed)

    async def list_instances(self) -> list[InstanceRow]:
        async with self._lock:
            rows = sorted(
                self._instances.values(),
                key=lambda r: (r.started_at or _utc(0), r.instance_id),
            )
            return [replace(r) for r in rows]

    # -- admission and transitions --------------------------------------------------------
    async def find_reusable(self, request_key: str, dedup_window_s: float) -> JobRow | None:
        async with self._lock:
            cutoff = self._now() - timedelta(seconds=dedup_window_s)
            candidates = [
                job
                for job in self._jobs.values()
                if job.request_key == request_key
                and not job.forced
                and (
                    job.status in ACTIVE_STATUSES
                    or (
                        job.status is JobStatus.COMPLETED
                        and job.finished_at is not None
                        and job.finished_at >= cutoff
                    )
                )
            ]
            if not candidates:
                return None
            newest = max(candidates, key=lambda j: (j.created_at or _utc(0), j.id))
            return without_output(newest)

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        async with self._lock:
            return self._insert_job(job, ttl_s)

    def _insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        """One admission's writes, under the lock (insert_job; each job of a group)."""
        if job.id in self._jobs:
            raise ValueError(f"job id {job.id} already exists")
        if not job.forced:
            # Invariant: at most one active non-forced job per request_key.
            for other in self._jobs.values():
                if (
                    other.request_key == job.request_key
                    and not other.forced
                    and other.status in ACTIVE_STATUSES
                ):
                    raise DuplicateActiveJob(other.id)
        self._ledger.reserve(job.id, job.reservations, self.clock())  # first: may refuse
        now = self._now()
        row = JobRow(
            id=job.id,
            provider=job.provider,
            status=JobStatus.RUNNING if job.running else JobStatus.QUEUED,
            started_at=now if job.running else None,
            request_key=job.request_key,
            transport=job.transport,
            correlation_id=job.correlation_id,
            owner_instance=job.owner_instance,
            lease_deadline=now + timedelta(seconds=ttl_s),
            hostname=job.hostname,
            working_dir=job.working_dir,
            model=job.model,
            session_id=job.session_id,
            request_json=job.request_json,
            principal=job.principal,
            created_at=now,
            updated_at=now,
            forced=job.forced,
            boot_id=job.boot_id,
        )
        self._jobs[job.id] = row
        return replace(row)

    async def mark_running(self, job_id: str, owner_instance: str, ttl_s: float) -> bool:
        async with self._lock:
            job = self._jobs.get(job_id)
            # Invariant: only a queued row of this owner starts running.
            if job is None or job.status is not JobStatus.QUEUED:
                return False
            if job.owner_instance != owner_instance:
                return False
            now = self._now()
            job.status = JobStatus.RUNNING
            job.started_at = now
            job.updated_at = now
            job.lease_deadline = now + timedelta(seconds=ttl_s)
            return True

    async def record_process(
        self, job_id: str, owner_instance: str, pid: int, pgid: int, pid_started_at: float
    ) -> bool:
        async with self._lock:
            job = self._jobs.get(job_id)
            # Invariant: only a running row of this owner gets a process identity.
            if job is None or job.status is not JobStatus.RUNNING:
                return False
            if job.owner_instance != owner_instance:
                return False
            job.pid, job.pgid, job.pid_started_at = pid, pgid, pid_started_at
            job.updated_at = self._now()
            return True

    async def complete(self, job_id: str, owner_instance: str,
                       completion: Completion) -> JobRow | None:
        if completion.status not in FINAL_STATUSES:
            raise ValueError(f"a completion cannot be {completion.status!s}")
        async with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            # Invariant: by the row's owner only, on an active row or one orphaned from
            # another host (self-heal); never any other terminal row (COMPLETE_JOB says why).
            allowed = job.owner_instance == owner_instance and (
                job.status in ACTIVE_STATUSES
                or (job.status is JobStatus.ORPHANED and job.orphaned_by != job.hostname))
            if not allowed:
                return None
            now = self._now()
            _apply_completion(job, completion)
            self._ledger.account(job_id, job.provider, job.model, completion.usage,
                                 now.timestamp())
            ended = (datetime.fromtimestamp(completion.ended_at, UTC)
                     if completion.ended_at is not None else now)
            job.finished_at = min(ended, now)
            job.updated_at = now
            job.lease_deadline = None
            self._outbox.add([job], now, completion.usage.cost_usd if completion.usage else None)
            return without_output(job)

    # -- usage and budgets ------------------------------------------------------------------
    async def usage_totals(self, group_by: GroupBy, since_day: str | None = None,
                           until_day: str | None = None) -> list[UsageRow]:
        async with self._lock:
            return self._ledger.totals(group_by, since_day, until_day)

    async def budget_windows(self, budgets: Sequence[tuple[str, str]]) -> list[BudgetWindow]:
        async with self._lock:
            return self._ledger.current(budgets, self.clock())

    async def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        await anyio.sleep(timeout_s)  # no notices here: the caller polls

    async def claim_sweep(self, task: str, every_s: float) -> bool:
        # Invariant (as in SQL): at most one claim per every_s per task; the lock serializes.
        async with self._lock:
            now = self.clock()
            last, runs = self._sweeps.get(task, (None, 0))
            if last is not None and last > now - every_s:
                return False
            self._sweeps[task] = (now, runs + 1)
            return True

    async def sweep_runs(self, task: str) -> int:
        return self._sweeps.get(task, (None, 0))[1]

    # -- worker hosts: one process has no remote jobs (admission refuses them) -----------------
    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        async with self._lock:
            row = self._instances.get(instance_id)
            if row is None:
                return False
            self._instances[instance_id] = replace(row, capabilities=capabilities)
            return True

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        return []

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        return []

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        return 0

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        return []

    async def release_reservations(self) -> int:
        async with self._lock:
            active = {i for i, job in self._jobs.items() if job.status in ACTIVE_STATUSES}
            return self._ledger.release_ended(active)

    async def request_cancel(self, job_id: str) -> JobRow | None:
        async with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            # Invariant: only an active row takes a cancel; the first request's time stays.
            if job.status in ACTIVE_STATUSES and job.cancel_requested_at is None:
                now = self._now()
                job.cancel_requested_at = now
                job.updated_at = now
            return without_output(job)

    async def list_cancel_requested(self, owner_instance: str) -> list[str]:
        async with self._lock:
            return [
                job.id
                for job in self._jobs.values()
                if job.owner_instance == owner_instance
                and job.status in ACTIVE_STATUSES
                and job.cancel_requested_at is not None
            ]

    async def save_progress(self, job_id: str, owner_instance: str, progress: Progress) -> bool:
        async with self._lock:
            job = self._jobs.get(job_id)
            # Invariant: partial output only for a running row of this owner.
            if job is None or job.status is not JobStatus.RUNNING:
                return False
            if job.owner_instance != owner_instance:
                return False
            job.output_bytes = progress.output_bytes
            job.output = progress.output
            job.stderr_tail = progress.stderr_tail
            job.updated_at = self._now()
            return True

    # -- the reaper -----------------------------------------------------------------------
    def _expired(self, job: JobRow, now: datetime, http_grace_s: float) -> bool:
        """The job's lease is the later of its own lease_deadline and its owner's instance
        lease; expired only when both passed (+grace for http). No owner row: no lease."""
        if job.status not in ACTIVE_STATUSES or job.lease_deadline is None:
            return False
        grace = timedelta(seconds=http_grace_s if job.transport == "http" else 0)
        owner = self._instances.get(job.owner_instance) if job.owner_instance else None
        owner_lease = owner.lease_expires_at if owner is not None else None
        if owner_lease is not None and owner_lease + grace >= now:
            return False
        return job.lease_deadline + grace < now

    async def list_expired_candidates(
        self, http_grace_s: float, limit: int = REAPER_BATCH_ROWS
    ) -> list[JobRow]:
        async with self._lock:
            now = self._now()
            expired = [job for job in self._jobs.values()
                       if self._expired(job, now, http_grace_s)]
            expired.sort(key=lambda job: job.lease_deadline or now)
            return [reaper_row(job) for job in expired[: max(limit, 0)]]

    async def recover_expired_leases(
        self, http_grace_s: float, job_ids: Collection[str], orphaned_by: str | None = None,
    ) -> list[JobRow]:
        async with self._lock:
            now = self._now()
            flipped = []
            for job_id in dict.fromkeys(job_ids):
                job = self._jobs.get(job_id)
                # Invariant: only a judged candidate, whose own lease AND its owner's lease
                # passed (+grace for http), and it is active.
                if job is None or not self._expired(job, now, http_grace_s):
                    continue
                job.status = JobStatus.ORPHANED
                job.error = job.error or ORPHANED_ERROR
                job.error_kind = ErrorKind.ORPHANED.value
                job.finished_at = now
                job.updated_at = now
                job.lease_deadline = None
                job.orphaned_by = orphaned_by
                self._outbox.add([job], now)
                flipped.append(reaper_row(job))
            return flipped

    # -- retention and reads --------------------------------------------------------------
    async def purge_terminal(self, older_than_s: float,
                             limit: int = RETENTION_BATCH_ROWS) -> list[str]:
        async with self._lock:
            cutoff = self._now() - timedelta(seconds=older_than_s)
            doomed = [job.id for job in self._jobs.values()
                      if job.status not in ACTIVE_STATUSES
                      and job.finished_at is not None and job.finished_at < cutoff]
            doomed = doomed[:max(limit, 0)]
            for job_id in doomed:
                del self._jobs[job_id]
            self._outbox.purge(doomed)
            return doomed

    async def find_job_ids(self, prefix: str, limit: int = PREFIX_MATCH_LIMIT) -> list[str]:
        if not prefix:
            return []
        async with self._lock:
            return sorted(i for i in self._jobs if i.startswith(prefix))[:max(limit, 0)]

    async def get_job(self, job_id: str, *, with_output: bool = True) -> JobRow | None:
        async with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            return replace(job) if with_output else without_output(job)

    async def read_output(
        self, job_id: str, offset: int, length: int, *, answer: bool = False
    ) -> tuple[bytes, int] | None:
        async with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            where = answer_in(job.result_json) if answer else None
            if isinstance(where, str):
                return page_of(where.encode("utf-8"), offset, length)
            return page_of((job.output or "").encode("utf-8"), offset, length, where)

    async def list_jobs(
        self, *, statuses: Sequence[JobStatus] | None = None, provider: str | None = None,
        owner_instance: str | None = None, principal: str | None = None,
        unowned_too: bool = False, limit: int = 50, with_output: bool = True,
    ) -> list[JobRow]:
        async with self._lock:
            wanted = {JobStatus(s) for s in statuses} if statuses is not None else None
            rows = [
                job
                for job in self._jobs.values()
                if (wanted is None or job.status in wanted)
                and (provider is None or job.provider == provider)
                and (owner_instance is None or job.owner_instance == owner_instance)
                and (principal is None or job.principal == principal
                     or (unowned_too and job.principal is None))
            ]
            rows.sort(key=lambda j: (j.created_at or _utc(0), j.id), reverse=True)
            copy = replace if with_output else without_output
            return [copy(job) for job in rows[: max(limit, 0)]]

    async def list_jobs_page(self, page: JobsPage) -> list[JobRow]:
        async with self._lock:
            wanted = set(page.statuses) if page.statuses is not None else None

            def order(job: JobRow) -> tuple[datetime, str]:
                return (job.created_at or _utc(0), job.id)

            cursor = None
            if page.after_id is not None:
                after = self._jobs.get(page.after_id)
                if after is None:
                    return []
                cursor = order(after)
            rows = [
                job for job in self._jobs.values()
                if (wanted is None or job.status in wanted)
                and (page.provider is None or job.provider == page.provider)
                and (page.hostname is None or job.hostname == page.hostname)
                and (cursor is None or order(job) < cursor)
            ]
            rows.sort(key=order, reverse=True)
            return [without_output(job) for job in rows[: max(page.limit, 0)]]


    # -- detach, adoption, re-queue ---------------------------------------------------------
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
            job.updated_at = now
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

    # -- attempt groups (issue 39) -----------------------------------------------------------
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

    # -- the completion-notice outbox (store/outbox.py) ------------------------------------
    async def claim_notices(self, instance_id: str, lease_s: float,
                            limit: int = CLAIM_BATCH) -> list[Notice]:
        async with self._lock:
            return self._outbox.claim(instance_id, lease_s, limit, self._now())

    async def record_notice_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        async with self._lock:
            return self._outbox.record_sink(notice_id, instance_id, sink)

    async def settle_notice(self, notice_id: str, instance_id: str, outcome: Settlement,
                            retry_in_s: float = 0.0, error: str | None = None) -> bool:
        async with self._lock:
            return self._outbox.settle(notice_id, instance_id, outcome, retry_in_s, error,
                                       self._now())

    async def list_notices(self, *, failed_only: bool = False,
                           limit: int = NOTICE_LIST_LIMIT) -> list[Notice]:
        async with self._lock:
            return self._outbox.listed(failed_only, limit)

    async def count_failed_notices(self) -> int:
        async with self._lock:
            return self._outbox.count_failed()



def _apply_completion(job: JobRow, completion: Completion) -> None:
    """Write a terminal outcome onto `job`; a pending cancel request turns it into cancelled."""
    # Read first (a file that cannot be read changes nothing); this store holds it anyway.
    output = completion.output
    text = output.text() if isinstance(output, OutputFile) else output
    status = completion.status
    error_kind = completion.error_kind
    error = completion.error
    if job.cancel_requested_at is not None and status is not JobStatus.CANCELLED:
        # Cancelled wins: the caller asked to stop while the run was still active.
        status = JobStatus.CANCELLED
        error_kind = ErrorKind.CANCELLED.value
        error = error or CANCELLED_ERROR
    job.status = status
    job.exit_code = completion.exit_code
    job.error = error
    job.error_kind = error_kind
    job.output = text
    job.stderr_tail = completion.stderr_tail
    job.output_bytes = completion.output_bytes
    job.truncated = completion.truncated
    job.result_json = completion.result_json

