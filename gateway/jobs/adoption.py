"""Adoption and re-queue: settling the jobs of gateways that are gone (docs/architecture.md).

Every sweep, and once at start before the first tool call is served, a gateway looks at the
jobs of its host whose owner is *proven* gone: its instance row is stopped (it detached or
stopped), or was collected, or the owner ran on this host and boot and its pid is not alive
with its start time. An owner that is only slow or stopped (SIGSTOP, a stall) is alive by
that test and is never adopted from: it heals its own jobs.

What happens to such a job is decided by its spool dir, never by guesses from the row:
- its start record names a supervisor: the run started. It is adopted (one CAS on
  owner_instance) and watched; its end record and spool files are finalized through the
  manager's one finalize path, exactly as its owner would have. A run that ended while no
  gateway lived is finalized at once.
- no supervisor claimed it (the row is queued, or it was marked running in this boot and the
  owner died before the supervisor claimed the run): the run is claimed for the re-queue in
  the spool (so a late supervisor can never start it) and queued again. A job is queued again each
  time an owner of it is proven gone before it started (nothing ran, so nothing is spent);
  a run is still launched at most once, because the spool's start record decides.
- a running row of a previous boot: left to the reaper, which orphans it. Spool records
  are not fsynced, so after a power loss no claim proves that a run never started.
- an owner proven alive here but stalled past its lease and a grace (SIGSTOPped for
  minutes): its jobs are taken over the same way. `orphaned` is final: an orphaned job is
  never adopted, healed or re-queued (a poller that saw it stopped polling).
An HTTP API call has no process: a running one whose owner is gone is re-queued once (it may
have reached the API and been billed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gateway import proc
from gateway.backoff import woken_or_after
from gateway.jobs.execution import ProcessExecution
from gateway.jobs.manager import JobManager
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.spec import ProcessIdentity, spec_from_spool
from gateway.jobs.run.spool import remove_job_dir, run_dir
from gateway.jobs.run.trust import adoption_problem
from gateway.jobs.targets import parsing_target, request_of_row, resolve_target
from gateway.jobs.worktrees.create import plan_of
from gateway.model import Completion, ErrorKind, GatewayError, InstanceRow, JobRow, JobStatus
from gateway.store.base import AdoptionCandidate, JobStore, TakeOver

CANCELLED_UNSTARTED = Completion(status=JobStatus.CANCELLED, error_kind=ErrorKind.CANCELLED,
                                 error="Cancelled before it started.")

log = structlog.get_logger(__name__)

ADOPT_BATCH = 100  # candidates read per sweep; the rest wait for the next sweep
# How long adoption waits for the terminal write of a run that had already ended (it reads
# the end record and the spool files: milliseconds; a store that is slow gets this long).
FINALIZE_ENDED_WITHIN_S = 10.0
REQUEUE_WINDOW_S = 3600.0  # lease.max_requeues counts the re-queues of this last hour
REQUEUE_REASONS_KEPT = 20  # the newest reasons kept in the row (the count keeps the rest)
# How long after it was orphaned a job of this host is still settled here (healed from its
# spool, or re-queued): at least this, or lease.instance_gc_s when that is longer. A short
# instance_gc_s (tests, chaos) must not make a dead owner's orphaned runs unhealable.
ORPHANED_WITHIN_MIN_S = 600.0


class Adopter:
    """Settles the jobs of gone owners on this host (one per gateway)."""

    def __init__(self, manager: JobManager, store: JobStore, identity: InstanceRow,
                 spool_root: Path,
                 stalled_owner_grace_s: Callable[[], float] = lambda: 300.0) -> None:
        self.manager = manager  # takes over what is settled here: drives, re-queues
        self.store = store
        self.identity = identity
        self.spool_root = spool_root  # where this host's runs keep their spools (the evidence)
        self.stalled_owner_grace_s = stalled_owner_grace_s
        # The last sweep's judgement of each owner it looked at: True when proven gone.
        self.judged_gone: dict[str | None, bool] = {}
        # The stalled-owner grace the last sweep judged by, read once a sweep. The reaper of
        # the same sweep judges by it too, never a second read: a grace shortened between
        # the two would let the reaper orphan, for good, a queued job that adoption had left
        # to its owner, when the next sweep's adoption would re-queue (or cancel) it.
        self.grace_s = stalled_owner_grace_s()
        # What the last sweep looked at, and whether that was every candidate (not cut
        # short by its batch, a closed admission or a closing gateway): see left_unseen.
        self.looked_at: set[str] = set()
        self.saw_all = False

    def alive_at_last_sweep(self, owner_id: str | None) -> bool:
        """Whether the last sweep judged this owner alive (it skipped the owner's jobs).

        The reaper's judgement in the same sweep follows this one, never a second probe: an
        owner SIGKILLed between the two (after a SIGSTOP) was alive when adoption looked, so
        its jobs are adopted next sweep (a run's end record finalized) rather than orphaned
        with their answer unread."""
        return self.judged_gone.get(owner_id) is False

    def left_unseen(self, job_id: str) -> bool:
        """Whether the last sweep was cut short before it looked at this job. The reaper of
        the same sweep leaves such a job of this host alone: only adoption can tell a run
        to finalize or work to re-queue from one nobody can settle, and `orphaned` is
        final; the next sweep looks again."""
        return not self.saw_all and job_id not in self.looked_at

    def owner_alive_here(self, owner: InstanceRow | None) -> bool:
        """Proven alive on this host and boot (pid with its start time), stopped or not."""
        if owner is None or owner.stopped_at is not None:
            return False
        if owner.hostname != self.identity.hostname or owner.boot_id != self.identity.boot_id:
            return False
        return not self.owner_gone(owner)

    def _stalled_past_grace(self, candidate: AdoptionCandidate, now: float) -> bool:
        """An owner alive here whose lease (and the job's) lapsed more than the grace ago:
        SIGSTOPped or stalled for minutes. Its job is taken over (a stale owner's late
        write no longer applies: every taker CASes owner_instance first) rather than left
        to be orphaned."""
        owner, job = candidate.owner, candidate.job
        if owner is None or owner.lease_expires_at is None or job.lease_deadline is None:
            return False
        lapsed = max(owner.lease_expires_at.timestamp(), job.lease_deadline.timestamp())
        return now - lapsed >= self.grace_s

    def owner_gone(self, owner: InstanceRow | None) -> bool:
        """Proven gone: no row (collected), a stopped row, or a dead pid on this host+boot.

        A collected row is proof because only a gateway of its host collects a lapsed row,
        and only once its pid is dead (LeaseKeeper._gc_instances, issue 23 item 5)."""
        if owner is None or owner.stopped_at is not None:
            return True
        if owner.hostname != self.identity.hostname or owner.boot_id != self.identity.boot_id:
            return False  # on another host: only its own row can say it is gone
        if owner.pid_started_at is None:
            return proc.process_start_time(owner.pid) is None
        return not proc.is_process_alive(owner.pid, owner.pid_started_at)

    def _take(self, job: JobRow) -> TakeOver:
        return TakeOver(job_id=job.id, expected_owner=job.owner_instance,
                        expected_status=job.status, instance_id=self.identity.instance_id,
                        hostname=self.identity.hostname, boot_id=self.identity.boot_id,
                        ttl_s=self.manager.settings.lease.ttl_s)

    async def sweep(self) -> int:
        """One pass; returns how many jobs this instance took over."""
        manager = self.manager
        self.judged_gone = gone = {}  # one probe per owner and sweep
        self.grace_s = self.stalled_owner_grace_s()  # one grace per sweep, the reaper's too
        self.looked_at = looked_at = set()
        self.saw_all = False
        if not manager.admission.open:
            return 0  # an instance that cannot renew its own lease takes over nothing
        candidates = await self.store.list_adoption_candidates(
            self.identity.instance_id, self.identity.hostname, self.identity.boot_id,
            max(manager.settings.lease.instance_gc_s, ORPHANED_WITHIN_MIN_S), ADOPT_BATCH)
        taken = 0
        now: float | None = None
        for candidate in candidates:
            if manager.closing:
                return taken
            looked_at.add(candidate.job.id)
            owner = candidate.job.owner_instance
            if owner not in gone:
                gone[owner] = self.owner_gone(candidate.owner)
            if candidate.job.id in manager.local_job_ids():
                continue
            why = _why_taken(candidate) if gone[owner] else "owner_stalled"
            if not gone[owner]:
                now = now if now is not None else await self.store.now()
                if not self._stalled_past_grace(candidate, now):
                    continue
                log.warning("taking over a job of an owner alive on this host but stalled "
                            "past its lease and the grace", action="adopt_stalled",
                            job_id=candidate.job.id, owner_instance=owner)
            taken += await self.settle(candidate.job, why)
        self.saw_all = len(candidates) < ADOPT_BATCH
        return taken

    async def settle(self, job: JobRow, why: str = "owner_gone") -> int:
        """Take over one job of a gone owner as its spool says (adopt, re-queue or end it);
        1 if this instance took it. The sweep's step, and the finalizer's (finalizer.py)."""
        spool = run_dir(self.spool_root, job)
        if job.transport == "process" and job.started_at is not None:
            if job.boot_id != self.identity.boot_id:
                # Marked running in a previous boot: its run, if it started, died with that
                # boot, and no spool record is fsynced (supervisor.py), so a missing claim
                # proves nothing after a power loss. Neither adopted (ADOPT_JOB) nor queued
                # again: the reaper orphans it. A run is never launched twice.
                return 0
            if not spool.is_dir():
                # Marked running, but its spool dir is not here: maybe another state dir ran
                # it. Nothing proves it never ran, so it is never run again (the reaper
                # orphans it once its lease passes).
                return 0
            start = sup.read_record(spool, sup.START_NAME)
            if start is None and sup.claim_for_requeue(spool, by=self.identity.instance_id):
                start = {"version": sup.RECORD_VERSION, "kind": "requeued"}
            start = start or sup.read_record(spool, sup.START_NAME)
            problem = sup.record_version_problem(sup.START_NAME, start)
            if problem is not None:  # a newer release's claim: never misread as unstarted
                log.warning("run not adopted: its spool is of a newer format", action="adopt",
                            job_id=job.id, problem=problem)
                return 0
            if start is not None and start.get("kind") == "supervisor":
                return await self._adopt_run(job, spool, start)
        if job.cancel_requested_at is not None:
            return await self._finish_unstarted(job, CANCELLED_UNSTARTED)
        return await self.requeue(job, why)

    async def _adopt_run(self, job: JobRow, spool: Path, start: dict[str, Any]) -> int:
        manager = self.manager
        problem = adoption_problem(spool, start)
        if problem is not None:  # a forged or tampered spool (issue 23, item 2)
            log.warning("run not adopted: its spool is not trustworthy", action="adopt",
                        job_id=job.id, problem=problem)
            return 0
        spec = spec_from_spool(job.id, spool)
        if spec is None:
            log.warning("run not adoptable: its spec is gone", action="adopt", job_id=job.id)
            return 0
        try:
            target = parsing_target(manager.settings, job.provider, job.request_json)
        except GatewayError as err:
            log.warning("run not adoptable: its request cannot be read", action="adopt",
                        job_id=job.id, error=err.message)
            return 0
        row = await self.store.adopt_job(self._take(job))
        if row is None:
            return 0  # another gateway won the compare-and-set
        identity = ProcessIdentity(pid=int(start["pid"]), pgid=int(start["pgid"]),
                                   started_at=float(start["started_at"]))
        execution = ProcessExecution.attach(target, spec, identity, manager.settings)
        ended = sup.read_record(spool, sup.END_NAME) is not None
        manager.start_adopted(row, target, execution, spec.timeout_s)
        if row.status is JobStatus.RUNNING and row.pid != identity.pid:
            # Its owner died before it named the supervisor on the row: the reaper's probe
            # needs it.
            await self.store.record_process(row.id, self.identity.instance_id, identity.pid,
                                            identity.pgid, identity.started_at)
        if ended:
            # Its run ended while no gateway was alive: finalized before this sweep returns,
            # so the start sweep (before the first tool call) leaves no answer to be built
            # from a row that still says running.
            await self._until_finalized(row.id)
        return 1

    async def _until_finalized(self, job_id: str) -> None:
        local = next((j for j in self.manager.local_jobs() if j.row.id == job_id), None)
        if local is None:
            return
        await woken_or_after(local.done, FINALIZE_ENDED_WITHIN_S)

    async def _finish_unstarted(self, job: JobRow, completion: Completion) -> int:
        """End a job whose run provably never started and whose cancel was requested (also
        one orphaned since: its owner was stopped before its cancel poller saw it)."""
        if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.ORPHANED):
            return 0
        if await self.store.adopt_job(self._take(job)) is None:
            return 0
        if await self.store.complete(job.id, self.identity.instance_id, completion):
            remove_job_dir(self.spool_root, job.id)  # no leftovers (issue 23, item 12)
        return 1

    async def requeue(self, job: JobRow, why: str) -> int:
        """Queue it again here (the store's CAS is the one winner and the rules; the manager
        holds the queue slot and drives it), uncharged but counted: past lease.max_requeues
        in an hour it ends failed (requeue_limit). 1 if this instance took it."""
        manager = self.manager
        if job.transport == "http" and job.started_at is not None and job.requeued_at is not None:
            return 0  # an API call that started is retried once: the reaper orphans it
        now = await self.store.now()
        reasons = _reasons(job.requeue_reasons)
        recent = [r for r in reasons if float(r.get("at", 0)) >= now - REQUEUE_WINDOW_S]
        limit = manager.settings.lease.max_requeues
        if len(recent) >= limit:
            log.warning("job failed: it lost its owner too often", action="requeue_limit",
                        job_id=job.id, requeue_count=job.requeue_count, limit=limit)
            return await self._finish_unstarted(job, Completion(
                status=JobStatus.FAILED, exit_code=1, error_kind=ErrorKind.REQUEUE_LIMIT,
                error=(f"The job lost its gateway {len(recent) + 1} times within an hour "
                       f"before it could finish (lease.max_requeues = {limit}; "
                       f"{job.requeue_count} re-queues in all: see requeue_reasons). It may "
                       f"be what takes its gateway down; check it before resubmitting.")))
        reasons = [*reasons, {"at": round(now, 3), "reason": why,
                              "previous_owner": job.owner_instance}][-REQUEUE_REASONS_KEPT:]
        if job.runs_on is not None:
            return await self._requeue_to_pool(job, why, json.dumps(reasons))
        _, request = request_of_row(job.request_json)  # read once: the target and the run
        try:
            target = resolve_target(manager.settings, job.provider, request)
            target.worktree = plan_of(job.request_json)  # the one planned at admission
        except GatewayError as err:
            log.warning("job not re-queued: its request cannot run here", action="requeue",
                        job_id=job.id, error=err.message)
            return 0
        take = dataclasses.replace(self._take(job), requeue_reasons=json.dumps(reasons))
        request.correlation_id = job.correlation_id
        row = await manager.requeue(take, job.provider, target, request)
        if row is None:
            return 0  # the queue is full (the next sweep tries again), or another won the CAS
        log.info("job re-queued: its owner left it unstarted", action="requeue", job_id=job.id,
                 previous_owner=job.owner_instance, reason=why,
                 requeue_count=row.requeue_count)
        return 1


    async def _requeue_to_pool(self, job: JobRow, why: str, reasons: str) -> int:
        """A job for other hosts (runs_on) goes back to the pool, not to this gateway: the
        same CAS (one winner; this gateway owns it, so its heartbeat keeps the lease), its
        claim cleared, and any worker that meets it claims it again (claims.py)."""
        take = dataclasses.replace(self._take(job), requeue_reasons=reasons)
        self.manager.owns_remote_jobs = True  # before the CAS: sweep_remote never misses it
        row = await self.store.requeue_job(take)
        if row is None:
            return 0
        log.info("job for other hosts re-queued to the pool: its owner left it unstarted",
                 action="requeue", job_id=job.id, previous_owner=job.owner_instance,
                 reason=why, requeue_count=row.requeue_count)
        return 1


def _why_taken(candidate: AdoptionCandidate) -> str:
    """Why an owner counts as gone (a re-queue's recorded reason)."""
    owner = candidate.owner
    if owner is None:
        return "owner_collected"
    return "owner_stopped" if owner.stopped_at is not None else "owner_dead"


def _reasons(text: str | None) -> list[dict[str, Any]]:
    try:
        parsed = json.loads(text) if text else []
    except ValueError:
        return []
    return [r for r in parsed if isinstance(r, dict)] if isinstance(parsed, list) else []

