"""The one path every request takes: admission, dedup, limiter, run, finalize, cancel, wait.

Admission: validate -> dedup by request key -> refuse when durable admission is off
(admission.py) -> limiter -> insert the queued row (fail closed) -> mark running (CAS) -> run.
One named asyncio task of this manager drives a job (drive.py): the MCP call that submitted
it may be cancelled or time out. Reads of any job are answered by `reads` (reads.py): the
front ends call it directly; the manager forwards none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.backoff import Backoff, woken_or_after
from gateway.config import Settings
from gateway.jobs.admission import AdmissionState
from gateway.jobs.drive import JobDriver
from gateway.jobs.execution import Execution, Launcher, build_execution
from gateway.jobs.limiter import Limiter, Ticket
from gateway.jobs.local_job import LocalJob
from gateway.jobs.placement import (
    CANCELLED_BEFORE_CLAIM,
    stored_runs_on,
    waiting_remote,
    with_repo,
)
from gateway.jobs.reads import JobReads, store_down
from gateway.jobs.requests import SubmitRequest, request_key, stored_request
from gateway.jobs.run import spool
from gateway.jobs.run.spec import stop_supervised_run
from gateway.jobs.targets import Target, remote_target, resolve_target
from gateway.jobs.worktrees.create import plan_for
from gateway.model import Completion, ErrorKind, GatewayError, JobRow, JobStatus, NewJob
from gateway.store.base import DuplicateActiveJob, JobStore, StoreUnavailable, TakeOver

log = structlog.get_logger(__name__)

ADOPT_RETRY = Backoff(first_s=0.5, max_s=5.0)  # re-reading a row after an unconfirmed insert
# on_shutdown = "stop": the grace between SIGTERM and SIGKILL of each run. Claude Code sends
# SIGINT, SIGTERM 100 ms later and SIGKILL 500 ms after that: 0.2 s of grace, the
# supervisor's 50 ms poll and the terminal writes fit before the SIGKILL.
STOP_GRACE_S = 0.2


@dataclass(slots=True)
class Submission:
    job: JobRow
    deduplicated: bool


@dataclass(slots=True)
class CancelOutcome:
    outcome: str  # "cancelled" | "cancel_requested" | "already_terminal"
    job: JobRow


class JobManager:
    """Owns this instance's jobs: stores, runs and finalizes them. Reads of any job go
    through `reads` (a JobReads over the same store and the jobs driven here)."""

    def __init__(self, settings: Settings, store: JobStore, instance_id: str,
                 hostname: str, boot_id: str, launch: Launcher = build_execution) -> None:
        """`launch` makes each run the driver starts: the real one unless a test passes a
        fake (tests/jobs/unit/ drive the whole job path with no process)."""
        self.settings = settings
        self.store = store
        self.instance_id = instance_id
        self.hostname = hostname
        self.boot_id = boot_id
        limits = settings.limits
        self.limiter = Limiter(limits.max_running_jobs, limits.max_running_per_provider,
                               limits.max_queued_jobs)
        # Durable admission: the lease keeper and shutdown change it through its methods.
        self.admission = AdmissionState()
        self.spool_root = spool.spool_root(settings.state_dir)
        self._local: dict[str, LocalJob] = {}
        self._background: set[asyncio.Task[None]] = set()
        # Whether this instance may own a job for other hosts (it admitted one, or took one
        # back to the pool): only then does sweep_remote read the store (idle windows on
        # one PostgreSQL hold no connection for it). Never reset: a miss would strand one.
        self.owns_remote_jobs = False
        self.reads = JobReads(settings, store, hostname, self._local)
        self._driver = JobDriver(settings, store, instance_id, self.admission, self.limiter,
                                 self._local, launch)

    def on_job_end(self, listener: Callable[[], None]) -> None:
        """Call `listener` after each terminal write this instance makes (no arguments: a
        wake-up, the listener reads the store)."""
        self._driver.end_listeners.append(listener)

    # -- admission state, for readers (gateway_status, the lease loops, tests) --------------
    @property
    def admitting(self) -> bool:
        """Whether this instance holds its lease (durable admission on, unless closing)."""
        return self.admission.lease_held

    @property
    def closing(self) -> bool:
        return self.admission.closing

    @property
    def store_problem(self) -> str | None:
        """Why the store cannot be used until a restart (its file was deleted), if so."""
        return self.admission.store_problem

    # -- admission -------------------------------------------------------------------------
    async def submit(self, provider: str, request: SubmitRequest) -> Submission:
        """Admit a request as a durable job (or return the identical job that exists).

        Raises GatewayError: invalid_input, not_found (CLI missing), unavailable (admission
        off or the store failed), saturated (queue full).
        """
        runs_on = stored_runs_on(request.runs_on)
        if runs_on is not None:
            admission = asyncio.create_task(self._admit_remote(provider, runs_on, request),
                                            name=f"admit-{provider}")
        else:
            target = resolve_target(self.settings, provider, request)  # validates, no I/O
            admission = asyncio.create_task(self._admit(provider, target, request),
                                            name=f"admit-{provider}")
        # Shielded: a caller that gives up (the MCP SDK cancels the tool coroutine when the
        # client times out) must neither abandon a row whose INSERT may already have
        # committed nor break a store connection mid-statement: the admission finishes, the
        # job runs, and an identical retry joins it.
        admission.add_done_callback(_retrieve_exception)
        return await asyncio.shield(admission)

    async def _admit(self, provider: str, target: Target, request: SubmitRequest) -> Submission:
        key = request_key(target.normalized, request.principal)
        if not request.force_refresh:
            existing = await self._find_reusable(key)
            if existing is not None:
                log.info("job deduplicated", action="dedup", job_id=existing.id, provider=provider)
                return Submission(existing, True)
        refusal = self.admission.refusal(provider)
        if refusal is None and self.limiter.would_refuse(provider):
            # A full queue: wait (holding nothing) for a finished run to free a place rather
            # than refuse at once; the limiter refuses when none freed within the bound.
            await self.limiter.wait_for_place(provider, self.settings.limits.queue_full_wait_s)
            refusal = self.admission.refusal(provider)  # it may have closed meanwhile
        if refusal is not None:
            raise refusal
        job_id = str(uuid.uuid4())
        target.worktree = plan_for(self.settings, target.repository,  # quota: raises first
                                   target.normalized.get("base_ref"), job_id, self.instance_id)
        ticket = self.limiter.acquire(provider)  # raises SATURATED, holding nothing
        new = NewJob(
            id=job_id, provider=provider, request_key=key, owner_instance=self.instance_id,
            transport=target.transport, correlation_id=request.correlation_id or job_id,
            hostname=self.hostname, boot_id=self.boot_id, working_dir=target.working_dir,
            model=target.model, session_id=request.session_id,
            request_json=stored_request(target.normalized, request.timeout_s,
                                        target.worktree.as_dict() if target.worktree else None),
            forced=request.force_refresh, reservations=target.reservations,
            principal=request.principal, running=self.ready_to_run(job_id, target, ticket),
        )
        return await self._insert_and_start(new, target, ticket, request)

    async def _admit_remote(self, provider: str, runs_on: str,
                            request: SubmitRequest) -> Submission:
        """Admit a job another host runs (runs_on): validated here except for what only that
        host can check, stored queued and owned by this gateway (its heartbeat keeps the
        lease) until a worker claims it (store.claim_jobs); never driven here. Needs the
        shared PostgreSQL store: on SQLite or memory no other host can see it."""
        if self.store.backend != "postgres":
            raise GatewayError(ErrorKind.INVALID_INPUT,
                               f"runs_on={request.runs_on!r} needs a PostgreSQL store shared "
                               f"with worker hosts ([persistence] backend = \"postgres\"); "
                               f"this gateway's store is {self.store.backend}. Omit runs_on "
                               f"to run the job on this host.")
        target = remote_target(self.settings, provider, request)
        repo = target.normalized.get("repo")
        if isinstance(repo, str):  # a worktree job: only a host holding it may take it
            runs_on = with_repo(runs_on, repo)
            # Its changes are applied here, into working_dir: only on this host.
            target.normalized["submitted_on"] = self.hostname
        key = request_key(target.normalized, request.principal)
        if not request.force_refresh:
            existing = await self._find_reusable(key)
            if existing is not None:
                return Submission(existing, True)
        refusal = self.admission.refusal(provider)
        if refusal is not None:
            raise refusal
        job_id = str(uuid.uuid4())
        self.owns_remote_jobs = True  # before the insert: sweep_remote never misses it
        new = NewJob(
            id=job_id, provider=provider, request_key=key, owner_instance=self.instance_id,
            transport=target.transport, correlation_id=request.correlation_id or job_id,
            hostname=self.hostname, boot_id=self.boot_id, working_dir=target.working_dir,
            model=target.model, session_id=request.session_id,
            request_json=stored_request(target.normalized, request.timeout_s),
            forced=request.force_refresh, reservations=target.reservations,
            principal=request.principal, runs_on=runs_on)
        try:
            row = await self.store.insert_job(new, self.settings.lease.ttl_s)
        except DuplicateActiveJob as dup:
            existing = await self.store.get_job(dup.existing_id) if dup.existing_id else None
            if existing is None:
                raise GatewayError(ErrorKind.UNAVAILABLE,
                                   "An identical request was admitted at the same moment but "
                                   "could not be read back; retry.") from None
            return Submission(existing, True)
        except StoreUnavailable as exc:
            raise store_down(exc) from None
        log.info("job admitted for another host", action="admit", job_id=row.id,
                 provider=provider, runs_on=runs_on)
        return Submission(row, False)

    def ready_to_run(self, job_id: str, target: Target, ticket: Ticket) -> bool:
        """Whether the job is inserted `running`: a run with a free slot now, whose first
        attempt dir is made first (drive.py makes it before the queued -> running CAS
        otherwise; without it nothing would prove that the run never started). One write
        instead of two on the path of every sync request (0.3 ms, issue #26). A dir that
        cannot be made leaves the job queued: its launch fails it with the reason."""
        if not ticket.granted or target.transport != "process":
            return False
        try:  # on the loop: two mkdirs, tens of microseconds
            spool.make_run_dir(spool.first_run_dir(self.spool_root, job_id))
        except OSError:
            return False
        return True

    def discard_unused_run_dir(self, new: NewJob) -> None:
        """The first attempt dir `ready_to_run` made, for a job that was not inserted."""
        if new.running:
            spool.discard_run_dir(spool.first_run_dir(self.spool_root, new.id))

    async def _insert_and_start(self, new: NewJob, target: Target, ticket: Ticket,
                                request: SubmitRequest) -> Submission:
        try:
            row = await self.store.insert_job(new, self.settings.lease.ttl_s)
        except DuplicateActiveJob as dup:
            # Another caller (maybe another instance) won the race for this request key:
            # exactly one run, and this caller gets that job.
            ticket.release()
            self.discard_unused_run_dir(new)
            existing = await self.store.get_job(dup.existing_id) if dup.existing_id else None
            if existing is None:
                existing = await self._find_reusable(new.request_key)
            if existing is None:
                raise GatewayError(ErrorKind.UNAVAILABLE,
                                   "An identical request was admitted at the same moment but "
                                   "could not be read back; retry.") from None
            return Submission(existing, True)
        except StoreUnavailable as exc:
            ticket.release()
            # The INSERT may have committed before the connection broke. Find out once the
            # store answers and run the row if it exists: never a row left active forever.
            self._spawn_background(self._adopt_if_stored(new, target, request),
                                   name=f"adopt-{new.id}")
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"Durable job admission failed for {new.provider}: the job store "
                               f"did not confirm the insert ({exc}). Retry: if the job was "
                               f"stored after all, it runs and an identical request joins "
                               f"it.") from None
        except BaseException:
            ticket.release()  # fail closed: the permit goes back and nothing runs
            self.discard_unused_run_dir(new)
            raise
        return self.start_local(row, target, ticket, request)

    def start_local(self, row: JobRow, target: Target, ticket: Ticket,
                    request: SubmitRequest) -> Submission:
        """Drive a queued row of ours: just admitted, or just re-queued (adoption.py)."""
        local = LocalJob(row=row, target=target, ticket=ticket,
                         spool_dir=spool.run_dir(self.spool_root, row),
                         timeout_s=request.timeout_s or self.settings.limits.default_timeout_s)
        self._local[row.id] = local
        local.task = asyncio.create_task(self._driver.drive(local), name=f"job-{row.id}")
        log.info("job admitted", action="admit", job_id=row.id, provider=row.provider,
                 transport=target.transport, queued=not ticket.granted)
        return Submission(row, False)

    def start_adopted(self, row: JobRow, target: Target, execution: Execution,
                      timeout_s: float) -> None:
        """Drive a run this instance adopted: it counts toward the limits like our own, a
        cancel stops it, and it is finalized exactly as its first owner would have."""
        local = LocalJob(row=row, target=target,
                         ticket=self.limiter.acquire_running(row.provider),
                         spool_dir=spool.run_dir(self.spool_root, row), timeout_s=timeout_s,
                         execution=execution, adopted=True)
        self._local[row.id] = local
        local.task = asyncio.create_task(self._driver.drive(local), name=f"job-{row.id}")
        log.info("job adopted", action="adopt", job_id=row.id, provider=row.provider,
                 status=str(row.status))

    async def requeue(self, take: TakeOver, provider: str, target: Target,
                      request: SubmitRequest) -> JobRow | None:
        """Queue a job of a gone owner again, here, and drive it (adoption.py decides that it
        may be): a queue slot first (None when the queue is full: the next sweep tries
        again), then the store's CAS, the one winner (None when it lost; the slot goes back).
        The old attempt's spool (its re-queue claim) goes: the new run has a dir of its own
        (spool.run_dir), and a late launcher of the old attempt finds its dir gone."""
        try:
            ticket = self.limiter.acquire(provider)
        except GatewayError:
            return None
        try:
            row = await self.store.requeue_job(take)
            if row is None:
                ticket.release()
                return None
        except StoreUnavailable:
            # The CAS may have committed with its answer lost: the row is then queued under
            # this instance, and nobody else would ever drive it (its owner is alive).
            row = await self._requeued_here_after_all(take.job_id)
            if row is None:
                ticket.release()
                raise
        except BaseException:
            ticket.release()  # the slot is not held for a job this instance does not drive
            raise
        spool.remove_job_dir(self.spool_root, take.job_id)  # and its temp cwds (issue 23, item 12)
        self.start_local(row, target, ticket, request)
        return row

    async def _requeued_here_after_all(self, job_id: str) -> JobRow | None:
        """The row if a re-queue whose answer was lost did commit: queued under this
        instance and not driven here (only this instance's CAS sets it so); else None,
        also when the store cannot tell yet (the next sweep's CAS then decides)."""
        with contextlib.suppress(StoreUnavailable):
            row = await self.store.get_job(job_id, with_output=False)
            if (row is not None and row.status is JobStatus.QUEUED
                    and row.owner_instance == self.instance_id and job_id not in self._local):
                return row
        return None

    def _spawn_background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _adopt_if_stored(self, new: NewJob, target: Target, request: SubmitRequest) -> None:
        """After an unconfirmed insert: drive the row if it was stored after all."""
        waits = ADOPT_RETRY.waits()
        while True:
            if self.closing:
                return  # our lease lapses with us; other instances orphan the row
            try:
                row = await self.store.get_job(new.id)
                break
            except StoreUnavailable:
                await asyncio.sleep(next(waits))
        if row is None:
            self.discard_unused_run_dir(new)  # it was not stored: nothing will run in it
            return
        if (row.owner_instance != self.instance_id
                or row.status not in (JobStatus.QUEUED, JobStatus.RUNNING)):
            return  # (running: inserted so and never launched, nobody but us launches it)
        log.warning("an unconfirmed insert was stored; running the job", action="adopt",
                    job_id=new.id)
        try:
            ticket = self.limiter.acquire(new.provider)
        except GatewayError as err:
            with contextlib.suppress(StoreUnavailable):
                await self.store.complete(new.id, self.instance_id, Completion(
                    status=JobStatus.FAILED, error_kind=err.kind, error=err.message))
            return
        self.start_local(row, target, ticket, request)

    async def _find_reusable(self, key: str) -> JobRow | None:
        try:
            return await self.store.find_reusable(key, self.settings.persistence.dedup_window_s)
        except StoreUnavailable as exc:
            raise store_down(exc) from None

    # -- cancel -----------------------------------------------------------------------------
    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job wherever it runs.

        Owned here: stops at once (queued: never spawns; running: the group is killed) and
        answers the terminal row. Owned by another instance: a conditional write on the row
        (`cancel_requested`); the owner's cancel poller stops it. Terminal: unchanged.
        """
        local = self._local.get(job_id)
        if local is not None:
            with contextlib.suppress(StoreUnavailable):
                # Recorded on the row first, so the terminal write comes out `cancelled`
                # even when the run completes in the same instant (cancelled wins).
                await self.store.request_cancel(job_id)
            self.cancel_local(job_id, ErrorKind.CANCELLED)
            grace = self.settings.limits.kill_grace_s + 2.0
            await woken_or_after(local.done, grace)
            return CancelOutcome("cancelled", await self.reads.get(job_id))
        row = await self.reads.get(job_id)
        if row.status is JobStatus.ORPHANED and row.hostname == self.hostname \
                and row.boot_id == self.boot_id:
            # Orphaned elsewhere while its process may still run here: stop that process
            # (whoever finalizes the row then records it as cancelled).
            stopped = await asyncio.to_thread(
                stop_supervised_run, spool.run_dir(self.spool_root, row), ErrorKind.CANCELLED,
                self.settings.limits.kill_grace_s)
            if stopped:
                return CancelOutcome("cancel_requested", row)
        if row.status.is_terminal:
            return CancelOutcome("already_terminal", row)
        try:
            after = await self.store.request_cancel(job_id)
        except StoreUnavailable as exc:
            raise store_down(exc) from None
        if after is None:
            raise self.reads.not_found(job_id)
        if waiting_remote(after) and after.owner_instance == self.instance_id:
            # Unclaimed: no claim can take it once the request is on the row, so it ends
            # here (a claim that came first makes this owner-guarded write miss).
            with contextlib.suppress(StoreUnavailable):
                ended = await self.store.complete(job_id, self.instance_id,
                                                  CANCELLED_BEFORE_CLAIM)
                if ended is not None:
                    return CancelOutcome("cancelled", ended)
        if after.status.is_terminal:
            return CancelOutcome("already_terminal", after)
        return CancelOutcome("cancel_requested", after)

    def cancel_local(self, job_id: str, reason: ErrorKind, grace_s: float | None = None) -> bool:
        """Stop a job this instance drives (used by cancel, the cancel poller and drain)."""
        job = self._local.get(job_id)
        if job is None:
            return False
        if job.cancel_reason is None:
            job.cancel_reason = reason
        if job.execution is not None:
            job.execution.cancel(reason, grace_s=grace_s)
        elif not job.ticket.granted:
            job.ticket.release()  # leaves the queue; the driver writes the terminal row
        return True

    def local_job_ids(self) -> list[str]:
        return list(self._local)

    def queue_position(self, job_id: str) -> int | None:
        """Where a job this instance holds waits for a run slot (1 = next); None when it
        is not queued here (running, finished, or owned by another instance)."""
        local = self._local.get(job_id)
        return self.limiter.position(local.ticket) if local is not None else None

    def local_jobs(self) -> list[LocalJob]:
        return list(self._local.values())

    def snapshot(self) -> dict[str, Any]:
        return {"admitting": self.admission.open,
                "local_jobs": len(self._local), **self.limiter.snapshot()}

    # -- shutdown ---------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting, fail queued jobs (`shutdown`), stop running groups (SIGTERM then
        SIGKILL), and wait for their terminal rows — within timeout_s. Returns whether
        everything finished in time (if not, the caller leaves the lease to expire)."""
        self.admission.close()
        jobs = list(self._local.values())
        grace = min(self.settings.limits.kill_grace_s, STOP_GRACE_S)
        for job in jobs:
            self.cancel_local(job.row.id, ErrorKind.SHUTDOWN, grace_s=grace)
        tasks = [j.task for j in jobs if j.task is not None]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return not pending

    async def remove_settled_spools(self) -> None:
        """The gateway stops: the spools of ended jobs waiting to be removed go now."""
        await self._driver.settled_spools.flush()


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    """Mark a shielded admission's outcome as seen when its caller is gone (no asyncio
    'exception was never retrieved' noise; the caller, if still there, got it)."""
    if not task.cancelled():
        task.exception()

