"""The one path every request takes: admission, dedup, limiter, run, finalize, cancel, wait.

Admission: validate -> dedup by request key -> refuse when durable admission is off -> limiter
-> insert the queued row (fail closed) -> mark running (CAS) -> run. One named asyncio task of
this manager drives a job: the MCP call that submitted it may be cancelled or time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gateway.config import Settings
from gateway.jobs.completion import completion_of
from gateway.jobs.execution import STDERR_TAIL_BYTES, Execution, build_execution
from gateway.jobs.full_store import fitted_completion
from gateway.jobs.limiter import Limiter, Ticket
from gateway.jobs.requests import SubmitRequest, request_key, stored_request
from gateway.jobs.run import spool
from gateway.jobs.run.runner import RunClaimedElsewhere, directories_error, stop_supervised_run
from gateway.jobs.targets import Target, resolve_target
from gateway.jobs.worktrees.create import plan_for
from gateway.model import (
    EXIT_CODES,
    Completion,
    ErrorKind,
    GatewayError,
    JobRow,
    JobStatus,
    NewJob,
    Progress,
)
from gateway.store.base import DuplicateActiveJob, JobStore, StoreFull, StoreUnavailable
from providers.parsing import char_boundary

log = structlog.get_logger(__name__)

PROGRESS_FLUSH_S = 2.0  # how stale another instance's view of a running job's output may be
REMOTE_POLL_S = 1.0  # waiting on a job run elsewhere polls the store about once a second
PROGRESS_TAIL_BYTES = 64 * 1024  # the partial output other instances can see while it runs
DEFAULT_RESULT_PAGE = 200_000
# A stored page is read with this many bytes more on each side: a UTF-8 character is at most
# 4 bytes, so the page's ends can be moved to character boundaries inside what was read.
PAGE_MARGIN_BYTES = 8
# Offsets beyond any output are clamped to this (2**53: exact in JSON, and offset + length
# stays inside SQLite's and PostgreSQL's 64-bit integers).
MAX_RESULT_OFFSET = 2**53
ADOPT_RETRY_FIRST_S = 0.5  # re-reading a row after an unconfirmed insert, while the store is down
ADOPT_RETRY_MAX_S = 5.0  # the longest pause between those re-reads
# on_shutdown = "stop": the grace between SIGTERM and SIGKILL of each run. Claude Code sends
# SIGINT, SIGTERM 100 ms later and SIGKILL 500 ms after that: 0.2 s of grace, the
# supervisor's 50 ms poll and the terminal writes fit before the SIGKILL.
STOP_GRACE_S = 0.2


ProgressCallback = Callable[[int, float], Awaitable[None]]  # (output bytes, elapsed s)


@dataclass(slots=True)
class Submission:
    job: JobRow
    deduplicated: bool


@dataclass(slots=True)
class ResultPage:
    job: JobRow
    output: str
    offset: int
    next_offset: int | None
    total_bytes: int
    complete: bool  # the job is terminal and this page reaches the end
    parsed: dict[str, Any] | None  # the parsed result without its text (the pages carry it)


@dataclass(slots=True)
class CancelOutcome:
    outcome: str  # "cancelled" | "cancel_requested" | "already_terminal"
    job: JobRow


@dataclass(eq=False)
class LocalJob:
    """A job this instance owns and drives."""

    row: JobRow
    target: Target
    ticket: Ticket
    spool_dir: Path
    timeout_s: float
    execution: Execution | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: ErrorKind | None = None
    started_mono: float = field(default_factory=time.monotonic)
    adopted: bool = False  # started by a gateway that is gone; watched and finalized here

    @property
    def output_bytes(self) -> int:
        return self.execution.stdout_bytes if self.execution else 0


class JobManager:
    """Owns this instance's jobs. Stores, runs and finalizes them; answers reads for any job."""

    def __init__(self, settings: Settings, store: JobStore, instance_id: str,
                 hostname: str, boot_id: str) -> None:
        self.settings = settings
        self.store = store
        self.instance_id = instance_id
        self.hostname = hostname
        self.boot_id = boot_id
        limits = settings.limits
        self.limiter = Limiter(limits.max_running_jobs, limits.max_running_per_provider,
                               limits.max_queued_jobs)
        self.admitting = False  # durable admission: turned on by the lease keeper
        # Why the store cannot be used until a restart (its file was deleted), if so: set
        # by the lease keeper, shown by gateway_status and in admission errors.
        self.store_problem: str | None = None
        self.closing = False
        self.detached = False  # shutting down with on_shutdown = "detach": runs go on
        self.spool_root = spool.spool_root(settings.state_dir)
        self._local: dict[str, LocalJob] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- admission -------------------------------------------------------------------------
    async def submit(self, provider: str, request: SubmitRequest) -> Submission:
        """Admit a request as a durable job (or return the identical job that exists).

        Raises GatewayError: invalid_input, not_found (CLI missing), unavailable (admission
        off or the store failed), saturated (queue full).
        """
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
        if self.closing:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"Admission is closed for {provider}: this gateway is shutting "
                               f"down. Retry; a new gateway instance will take the request.")
        if self.store_problem is not None:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"Durable admission is off for {provider}: "
                               f"{self.store_problem}")
        if not self.admitting:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"Durable admission is off for {provider}: this gateway instance "
                               f"could not register or lost its heartbeat lease (job store "
                               f"unreachable). Running jobs continue. Retry in a few seconds.")
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
            principal=request.principal,
        )
        return await self._insert_and_start(new, target, ticket, request)

    async def _insert_and_start(self, new: NewJob, target: Target, ticket: Ticket,
                                request: SubmitRequest) -> Submission:
        try:
            row = await self.store.insert_job(new, self.settings.lease.ttl_s)
        except DuplicateActiveJob as dup:
            # Another caller (maybe another instance) won the race for this request key:
            # exactly one run, and this caller gets that job.
            ticket.release()
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
            # store answers and run the row if it exists: never a row queued forever.
            self._spawn_background(self._adopt_if_stored(new, target, request),
                                   name=f"adopt-{new.id}")
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"Durable job admission failed for {new.provider}: the job store "
                               f"did not confirm the insert ({exc}). Retry: if the job was "
                               f"stored after all, it runs and an identical request joins "
                               f"it.") from None
        except BaseException:
            ticket.release()  # fail closed: the permit goes back and nothing runs
            raise
        return self.start_local(row, target, ticket, request)

    def start_local(self, row: JobRow, target: Target, ticket: Ticket,
                    request: SubmitRequest) -> Submission:
        """Drive a queued row of ours: just admitted, or just re-queued (adoption.py)."""
        local = LocalJob(row=row, target=target, ticket=ticket,
                         spool_dir=spool.run_dir(self.spool_root, row),
                         timeout_s=request.timeout_s or self.settings.limits.default_timeout_s)
        self._local[row.id] = local
        local.task = asyncio.create_task(self._drive(local), name=f"job-{row.id}")
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
        local.task = asyncio.create_task(self._drive(local), name=f"job-{row.id}")
        log.info("job adopted", action="adopt", job_id=row.id, provider=row.provider,
                 status=str(row.status))

    def _spawn_background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _adopt_if_stored(self, new: NewJob, target: Target, request: SubmitRequest) -> None:
        """After an unconfirmed insert: drive the row if it was stored after all."""
        delay = ADOPT_RETRY_FIRST_S
        while True:
            if self.closing:
                return  # our lease lapses with us; other instances orphan the row
            try:
                row = await self.store.get_job(new.id)
                break
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, ADOPT_RETRY_MAX_S)
        if row is None or row.status != JobStatus.QUEUED or row.owner_instance != self.instance_id:
            return
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
            raise _store_down(exc) from None

    # -- driving one job --------------------------------------------------------------------
    async def _drive(self, job: LocalJob) -> None:
        """queued -> running -> terminal for one job. Never raises; always sets job.done."""
        try:
            await self._drive_inner(job)
        except Exception as exc:
            log.exception("job driver failed", action="drive", job_id=job.row.id)
            await self._finish(job, Completion(status=JobStatus.FAILED, exit_code=1,
                                               error=f"internal gateway error: {exc}",
                                               error_kind=ErrorKind.LAUNCH_FAILED))
        finally:
            job.ticket.release()
            self._local.pop(job.row.id, None)
            job.done.set()

    async def _drive_inner(self, job: LocalJob) -> None:
        if job.adopted:
            await self._run_to_end(job)
            return
        limits = self.settings.limits
        if not job.ticket.granted:
            try:
                await asyncio.wait_for(job.ticket.wait(), limits.queue_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                if self.detached:
                    raise  # released at detach: it stays queued for the next gateway
                if job.cancel_reason is not None:
                    await self._finish_unstarted(job)
                    return
                full = self.limiter.full_limit(job.row.provider)
                await self._fail(job, GatewayError(
                    ErrorKind.QUEUE_TIMEOUT, f"Gateway is at capacity for {job.row.provider}: "
                    f"the job waited {limits.queue_timeout_s:g} s in the queue without a free "
                    f"run slot ({full} reached). Retry later or raise {full.split(' ')[0]}."))
                return
        if job.cancel_reason is not None:
            await self._finish_unstarted(job)
            return
        if self.closing:
            return  # shutting down: a queued job stays queued (detach releases it) or is failed
        made = False  # whether this launch made its attempt's spool dir (spool.run_dir)
        if job.target.transport == "process":
            # Made before the row says running: an adopter that finds it with no start record
            # may re-queue it (SIGKILLed in between); without it nothing proves it never ran.
            try:
                made = await asyncio.to_thread(spool.make_run_dir, job.spool_dir)
            except OSError as exc:
                await self._fail(job, GatewayError(ErrorKind.LAUNCH_FAILED,
                                                   directories_error(exc)))
                return
        # CAS queued -> running BEFORE spawning: a row orphaned or cancelled while it waited
        # is never launched (no child is spawned only to be killed).
        if not await self.store.mark_running(job.row.id, self.instance_id,
                                             self.settings.lease.ttl_s):
            log.warning("job not launched: row no longer queued", action="mark_running",
                        job_id=job.row.id)
            if made:  # nothing runs in it: a woken owner's old attempt (issue 23, item 12)
                await asyncio.to_thread(spool.discard_run_dir, job.spool_dir)
            return
        job.row.status = JobStatus.RUNNING
        job.execution = build_execution(job.target, job.row.id, job.spool_dir, job.timeout_s,
                                        self.settings)
        if self.detached:  # the gateway left while this one was being marked: it runs on
            job.execution.detach()
        try:
            identity = await job.execution.start()
        except RunClaimedElsewhere:
            log.warning("run not launched here: a gateway that judged this one gone re-queued "
                        "the job", action="run_claimed_elsewhere", job_id=job.row.id)
            return
        except GatewayError as err:
            await self._fail(job, err)
            return
        if job.cancel_reason is not None:  # cancelled while spawning
            job.execution.cancel(job.cancel_reason)
        if identity is not None:
            try:
                recorded = await self.store.record_process(
                    job.row.id, self.instance_id, identity.pid, identity.pgid,
                    identity.started_at)
            except StoreUnavailable:
                recorded = False
            if not recorded:
                # The run goes on: if the row was orphaned meanwhile, this instance's guarded
                # terminal write self-heals it; without a pid the reaper just cannot prove
                # the process alive, which errs towards orphaning, never towards losing.
                log.warning("process identity not recorded", action="record_process",
                            job_id=job.row.id, pid=identity.pid)
        await self._run_to_end(job)

    async def _run_to_end(self, job: LocalJob) -> None:
        """Watch a started run (ours or adopted) until its group is gone, then finalize it:
        the one finalize path for every run."""
        assert job.execution is not None
        flusher = asyncio.create_task(self._flush_progress(job), name=f"progress-{job.row.id}")
        try:
            outcome = await job.execution.wait()  # returns when the group is gone
        except RunClaimedElsewhere:
            log.warning("run not started here: a gateway that judged this one gone claimed it "
                        "to re-queue the job", action="run_claimed_elsewhere", job_id=job.row.id)
            return
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
        completion = completion_of(outcome, job.target.login_hint, job.target.model)
        # The parsed answer is in completion.result_json now; its text can be as large as
        # the output, so the outcome must not stay alive through the terminal write.
        del outcome
        await self._finish(job, completion)

    async def _finish_unstarted(self, job: LocalJob) -> None:
        reason = job.cancel_reason or ErrorKind.CANCELLED
        if reason == ErrorKind.SHUTDOWN:
            await self._finish(job, Completion(
                status=JobStatus.FAILED, exit_code=1, error_kind=ErrorKind.SHUTDOWN,
                error="The gateway shut down before this queued job started. Resubmit it."))
        else:
            await self._finish(job, Completion(status=JobStatus.CANCELLED,
                                               error_kind=ErrorKind.CANCELLED,
                                               error="Cancelled before it started."))

    async def _finish(self, job: LocalJob, completion: Completion) -> None:
        """The guarded terminal write, retried while the store is down (the result is never
        dropped: if it cannot be written before the lease lapses, the row is orphaned and
        this write self-heals it later). A full disk is different: the same write would
        fail forever, so it is made smaller until it fits (full_store.py)."""
        delay = 0.2
        original, refused_full = completion, 0
        while True:
            try:
                applied = await self.store.complete(job.row.id, self.instance_id, completion)
                break
            except StoreFull as exc:
                refused_full += 1
                smaller = fitted_completion(original, refused_full, str(exc),
                                            self.settings.state_dir)
                log.warning("terminal write refused: the store's disk is full",
                            action="complete_store_full", job_id=job.row.id,
                            kept_bytes=smaller.output_bytes if smaller else 0, error=str(exc))
                if smaller is not None:
                    completion = smaller
                    continue
                # Nothing left to drop: the row needs no spool file any more, and the
                # space it frees may be what the write lacks.
                await asyncio.to_thread(shutil.rmtree, job.spool_dir, ignore_errors=True)
                if self.closing:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except StoreUnavailable as exc:
                if self.closing:
                    log.warning("terminal write failed during shutdown", action="complete",
                                job_id=job.row.id, error=str(exc))
                    return
                log.warning("terminal write failed; retrying", action="complete",
                            job_id=job.row.id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        log.info("job finished", action="complete", job_id=job.row.id,
                 status=str(completion.status), error_kind=completion.error_kind, applied=applied)
        if not applied:
            # The row is not ours to end any more (a peer adopted or re-queued the job while
            # this instance was stopped or cut off): the spool is the new owner's evidence,
            # its end record above all. Deleting it here made the owner's finalize read "the
            # supervisor ended without recording how" (retention purges what is left).
            return
        # The row holds the output: no attempt's spool is needed (off the loop: rmtree blocks).
        await asyncio.to_thread(shutil.rmtree, spool.job_dir(self.spool_root, job.row.id),
                                ignore_errors=True)

    async def _fail(self, job: LocalJob, err: GatewayError) -> None:
        await self._finish(job, Completion(status=JobStatus.FAILED, error=err.message,
                                           exit_code=EXIT_CODES.get(err.kind, 1),
                                           error_kind=err.kind))

    async def _flush_progress(self, job: LocalJob) -> None:
        last = -1
        while True:
            await asyncio.sleep(PROGRESS_FLUSH_S)
            execution = job.execution
            if execution is None or execution.stdout_bytes == last:
                continue
            last = execution.stdout_bytes
            output, stderr_tail = await asyncio.to_thread(_progress_tails, execution)
            with contextlib.suppress(StoreUnavailable):
                await self.store.save_progress(job.row.id, self.instance_id, Progress(
                    output_bytes=last, output=output, stderr_tail=stderr_tail))

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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(local.done.wait(), grace)
            return CancelOutcome("cancelled", await self.get(job_id))
        row = await self.get(job_id)
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
            raise _store_down(exc) from None
        if after is None:
            raise self._not_found(job_id)
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

    # -- reads ------------------------------------------------------------------------------
    async def get(self, job_id: str) -> JobRow:
        """The job's row without its output: a light read (the output and the parsed answer
        can be max_output_bytes; status, wait and cancel need neither; read_result pages
        them). result_json comes without its `text`."""
        try:
            row = await self.store.get_job(job_id, with_output=False)
        except StoreUnavailable as exc:
            local = self._local.get(job_id)
            if local is not None:
                return local.row
            raise _store_down(exc) from None
        if row is None:
            raise self._not_found(job_id)
        local = self._local.get(job_id)
        if local is not None and row.status.is_active:
            row.output_bytes = max(row.output_bytes, local.output_bytes)
        return row

    def _not_found(self, job_id: str) -> GatewayError:
        return GatewayError(ErrorKind.JOB_NOT_FOUND,
                            f"No job with id {job_id!r}. Check the id (llm_job_list shows recent "
                            f"jobs); finished jobs are kept "
                            f"{self.settings.persistence.retention_days:g} days.")

    async def wait(self, job_id: str, timeout_s: float,
                   on_progress: ProgressCallback | None = None) -> JobRow:
        """Until the job is terminal or timeout_s passed; returns the row either way.

        A job driven here is awaited on its own completion event (no store polling, so a
        sync request learns of the exit at once); a job run elsewhere is re-read about once a
        second.
        """
        started = time.monotonic()
        deadline = started + max(0.0, timeout_s)
        row = await self.get(job_id)
        while row.status.is_active:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            local = self._local.get(job_id)
            step = min(remaining, REMOTE_POLL_S)
            if local is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(local.done.wait(), step)
            else:
                await asyncio.sleep(step)
            row = await self.get(job_id)
            if on_progress is not None and row.status.is_active:
                await on_progress(row.output_bytes, time.monotonic() - started)
        return row

    async def list_jobs(self, status: str | None = None, provider: str | None = None, limit: int = 20,
                        principal: str | None = None, unowned_too: bool = False) -> list[JobRow]:
        statuses = None
        if status:
            try:
                statuses = [JobStatus(status)]
            except ValueError:
                raise GatewayError(ErrorKind.INVALID_INPUT,
                                   f"Unknown status {status!r}; use one of "
                                   f"{[s.value for s in JobStatus]}.") from None
        try:
            return await self.store.list_jobs(statuses=statuses, provider=provider, limit=limit,
                                              principal=principal, unowned_too=unowned_too, with_output=False)
        except StoreUnavailable as exc:
            raise _store_down(exc) from None

    async def read_result(self, job_id: str, offset: int = 0,
                          max_bytes: int = DEFAULT_RESULT_PAGE, raw: bool = False) -> ResultPage:
        """A page of the job's output: the parsed answer text when the provider gave one
        (raw=False), else stdout. Offsets are UTF-8 byte offsets; a page never splits a
        character. Works for any instance's job and after restarts."""
        if offset < 0 or max_bytes < 1:
            raise GatewayError(ErrorKind.INVALID_INPUT, "offset must be >= 0 and max_bytes >= 1.")
        # Past any output's end (and within every store's 64-bit integers): an empty page.
        offset, max_bytes = min(offset, MAX_RESULT_OFFSET), min(max_bytes, MAX_RESULT_OFFSET)
        row = await self.get(job_id)
        parsed = json.loads(row.result_json) if row.result_json else None
        upto = offset + max_bytes + PAGE_MARGIN_BYTES
        # Only the page (and a few bytes around it) is read, however large the output or the
        # offset. Stored text is valid UTF-8, so no boundary moves by more than 3 bytes.
        base = max(0, offset - PAGE_MARGIN_BYTES)  # the output position of data[0]
        data: bytes
        if row.status.is_terminal:
            data, total = await self._stored_output(job_id, base, upto - base, answer=not raw)
        else:
            data, total = await self._partial_stdout(row, base, upto - base)
        start = base + char_boundary(data, min(offset, total) - base)
        end = base + char_boundary(data, min(total, start + max_bytes) - base)
        if end == start and start < total:  # max_bytes smaller than one character: take it
            end = min(total, base + char_boundary(data, start + 1 - base, forward=True))
        next_offset = end if end < total else None
        if end >= base + len(data) and end < total:  # a running job's prefix: more is coming
            next_offset = end
        page = data[start - base:end - base].decode("utf-8", errors="replace")
        return ResultPage(job=row, output=page, offset=start, next_offset=next_offset,
                          total_bytes=total, complete=row.status.is_terminal and next_offset is None,
                          parsed=parsed)

    async def _stored_output(self, job_id: str, offset: int, length: int,
                             answer: bool = False) -> tuple[bytes, int]:
        try:
            found = await self.store.read_output(job_id, offset, length, answer=answer)
        except StoreUnavailable as exc:
            raise _store_down(exc) from None
        if found is None:
            raise self._not_found(job_id)
        return found

    async def _partial_stdout(self, row: JobRow, base: int, length: int) -> tuple[bytes, int]:
        """Output so far of a running job (`length` bytes from `base`, and the total): the
        spool file when it runs on this host with our state dir, else what its owner flushed
        to the row. A spool file this process cannot read (EACCES, gone) falls back too."""
        path = spool.stdout_path(spool.run_dir(self.spool_root, row))
        if row.hostname == self.hostname:
            try:
                return await asyncio.to_thread(spool.read_range, path, base, length)
            except OSError:
                pass
        return await self._stored_output(row.id, base, length)

    def snapshot(self) -> dict[str, Any]:
        return {"admitting": self.admitting and not self.closing,
                "local_jobs": len(self._local), **self.limiter.snapshot()}

    # -- shutdown ---------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting, fail queued jobs (`shutdown`), stop running groups (SIGTERM then
        SIGKILL), and wait for their terminal rows — within timeout_s. Returns whether
        everything finished in time (if not, the caller leaves the lease to expire)."""
        self.closing = True
        jobs = list(self._local.values())
        grace = min(self.settings.limits.kill_grace_s, STOP_GRACE_S)
        for job in jobs:
            self.cancel_local(job.row.id, ErrorKind.SHUTDOWN, grace_s=grace)
        tasks = [j.task for j in jobs if j.task is not None]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        return not pending

    def remove_spool(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            shutil.rmtree(spool.job_dir(self.spool_root, job_id), ignore_errors=True)


def _progress_tails(execution: Execution) -> tuple[str, str]:
    """The stdout and stderr tails a progress flush writes (file reads: run in a thread)."""
    return (execution.read_stdout_tail(PROGRESS_TAIL_BYTES),
            execution.read_stderr_tail(STDERR_TAIL_BYTES))


def _store_down(exc: StoreUnavailable) -> GatewayError:
    """The one answer for a read or cancel the store could not serve (retryable)."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"The job store is unreachable ({exc}); retry shortly.")


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    """Mark a shielded admission's outcome as seen when its caller is gone (no asyncio
    'exception was never retrieved' noise; the caller, if still there, got it)."""
    if not task.cancelled():
        task.exception()

