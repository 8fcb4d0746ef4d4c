"""Driving one job of this instance: queued -> running -> its terminal row.

One named asyncio task per job runs `JobDriver.drive` (the MCP call that submitted the job
may be cancelled or time out; the drive goes on). It waits for a run slot, marks the row
running with a compare-and-set before anything is spawned, starts the run, flushes its
progress for other instances, settles an isolated job's worktree once the run is over, and
ends with the one guarded terminal write for every run, started here or adopted.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from typing import Any

import structlog

from gateway.backoff import Backoff
from gateway.config import Settings
from gateway.jobs.admission import AdmissionState
from gateway.jobs.execution import (
    STDERR_TAIL_BYTES,
    Execution,
    ExecutionOutcome,
    Launcher,
    build_execution,
)
from gateway.jobs.full_store import fitted_completion
from gateway.jobs.limiter import Limiter
from gateway.jobs.local_job import LocalJob
from gateway.jobs.outcome_to_completion import completion_of
from gateway.jobs.run import spool
from gateway.jobs.run.spec import RunClaimedElsewhere, directories_error
from gateway.jobs.settled_spools import SettledSpools
from gateway.jobs.worktrees.finish import settle_worktree
from gateway.jobs.worktrees.remote import store_patch
from gateway.model import EXIT_CODES, Completion, ErrorKind, GatewayError, JobStatus, Progress
from gateway.store.base import JobStore, StoreFull, StoreUnavailable

log = structlog.get_logger(__name__)

PROGRESS_FLUSH_S = 2.0  # how stale another instance's view of a running job's output may be
PROGRESS_TAIL_BYTES = 64 * 1024  # the partial output other instances can see while it runs
TERMINAL_WRITE_RETRY = Backoff(first_s=0.2, max_s=5.0)  # the terminal write, store down or full
LAUNCH_WRITE_RETRY = Backoff(first_s=0.2, max_s=5.0)  # marking a job running, store down


class JobDriver:
    """Drives the jobs of one manager (the same store, instance, limiter and admission
    state); removes each from the manager's `local` jobs once it is settled."""

    def __init__(self, settings: Settings, store: JobStore, instance_id: str,
                 admission: AdmissionState, limiter: Limiter,
                 local: dict[str, LocalJob], launch: Launcher = build_execution) -> None:
        self.settings = settings
        self.launch = launch  # makes each run (tests/jobs/unit/ pass a fake: no process)
        self.store = store
        self.instance_id = instance_id
        self.admission = admission
        self.limiter = limiter
        self.spool_root = spool.spool_root(settings.state_dir)
        self.settled_spools = SettledSpools(self.spool_root)
        self._local = local
        # Told after each terminal write of this instance: the notice deliverer and the
        # attempts coordinator sweep at once instead of polling an idle store often.
        self.end_listeners: list[Callable[[], None]] = []

    async def drive(self, job: LocalJob) -> None:
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
            self._local.pop(job.row.id, None)  # the manager's jobs: it is not one any more
            job.done.set()
        if job.spool_settled:
            # The row holds the output: no attempt's spool is needed. Removed once the
            # answer `done` lets out is on its way (settled_spools.py).
            self.settled_spools.add(job.row.id)

    async def _drive_inner(self, job: LocalJob) -> None:
        if job.adopted:
            await self._run_to_end(job)
            return
        limits = self.settings.limits
        if not job.ticket.granted:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that comes
                # as the ticket is granted (backoff.woken_or_after).
                async with asyncio.timeout(limits.queue_timeout_s):
                    await job.ticket.wait()
            except (TimeoutError, asyncio.CancelledError):
                if self.admission.detached:
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
        if self.admission.closing:
            # Shutting down: a queued job stays queued (detach releases it) or is failed; one
            # inserted running, unlaunched, is re-queued by the next gateway (no claim).
            return
        # Inserted running (manager.ready_to_run: its attempt dir made first), the insert was
        # its transition; a queued row is marked now.
        if job.row.status is not JobStatus.RUNNING and not await self._mark_for_launch(job):
            return
        job.row.status = JobStatus.RUNNING
        job.execution = self.launch(job.target, job.row.id, job.spool_dir, job.timeout_s,
                                    self.settings)
        if self.admission.detached:  # the gateway left while this one was being marked: it runs on
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

    async def _mark_for_launch(self, job: LocalJob) -> bool:
        """A queued row's launch: its attempt dir, then the CAS queued -> running. False: not
        to be launched here (failed, given up, or no longer queued); what it made is gone."""
        made = False  # whether this launch made its attempt's spool dir (spool.run_dir)
        if job.target.transport == "process":
            # Made before the row says running: an adopter that finds it with no start record
            # may re-queue it (SIGKILLed in between); without it nothing proves it never ran.
            # On the loop: two mkdirs take tens of microseconds, a thread hop about 0.1 ms of
            # CPU and as much again on a sync request's path (bench/README.md, cost rows).
            try:
                made = spool.make_run_dir(job.spool_dir)
            except OSError as exc:
                await self._fail(job, GatewayError(ErrorKind.LAUNCH_FAILED,
                                                   directories_error(exc)))
                return False
        # CAS queued -> running BEFORE spawning: a row orphaned or cancelled while it waited
        # is never launched (no child is spawned only to be killed).
        marked = await self._mark_running(job)
        if marked is None:  # gave up waiting: its attempt dir stays, the evidence of no start
            if job.cancel_reason is not None:
                await self._finish_unstarted(job)
            return False
        if not marked:
            log.warning("job not launched: row no longer queued", action="mark_running",
                        job_id=job.row.id)
            if made:  # nothing runs in it: a woken owner's old attempt (issue 23, item 12)
                await asyncio.to_thread(spool.discard_run_dir, job.spool_dir)
            return False
        return True

    async def _mark_running(self, job: LocalJob) -> bool | None:
        """The launch's CAS queued -> running, waiting out a store that is down, busy or out
        of connections (an admitted job waits for its store, it does not fail: issue #29).
        True: marked, launch it; False: the row is no longer queued (orphaned, cancelled,
        taken by a peer); None: given up unlaunched while waiting (cancelled here, or the
        gateway is shutting down: the row stays queued for the next gateway)."""
        waits = LAUNCH_WRITE_RETRY.waits()
        unsure = False  # a failed try may still have committed, its answer lost
        while True:
            try:
                if await self.store.mark_running(job.row.id, self.instance_id,
                                                 self.settings.lease.ttl_s):
                    return True
                if not unsure:
                    return False
                # Running under this instance with no process yet: only this driver marks
                # this job's row so, so that was our own earlier try.
                row = await self.store.get_job(job.row.id, with_output=False)
                return (row is not None and row.status is JobStatus.RUNNING
                        and row.owner_instance == self.instance_id and row.pid is None)
            except StoreUnavailable as exc:
                unsure = True
                log.warning("job waits for the store to launch", action="mark_running",
                            job_id=job.row.id, error=str(exc))
            if job.cancel_reason is not None or self.admission.closing:
                return None
            await asyncio.sleep(next(waits))

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
        worktree = await self._settle_worktree(job, outcome)
        completion = completion_of(outcome, job.target.login_hint, job.target.model, worktree)
        # The parsed answer is in completion.result_json now; its text can be as large as
        # the output, so the outcome must not stay alive through the terminal write.
        del outcome
        await self._finish(job, completion)

    async def _settle_worktree(self, job: LocalJob,
                               outcome: ExecutionOutcome) -> dict[str, Any] | None:
        """An isolated job's worktree once its run is over: what the CLI changed committed
        to the job's branch, or worktree and branch removed when it changed nothing. A step
        of the drive, not of the run: every run, started here or adopted, passes here once
        before its terminal write, which carries the report (None: not isolated). Never
        raises (settle_worktree reports a failure instead)."""
        ended = outcome.error_kind or f"exit {outcome.exit_code}"
        report = await settle_worktree(job.target.worktree, job.row.id, ended,
                                       self.settings.worktrees.lfs)
        if report is not None and job.row.runs_on is not None and job.target.worktree:
            report["patch"] = await store_patch(self.store, job.target.worktree, job.row,
                                                self.settings.worker.max_patch_bytes)
        return report

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
        waits = TERMINAL_WRITE_RETRY.waits()
        original, refused_full = completion, 0
        while True:
            try:
                written = await self.store.complete(job.row.id, self.instance_id, completion)
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
                if self.admission.closing:
                    return
                await asyncio.sleep(next(waits))
            except StoreUnavailable as exc:
                if self.admission.closing:
                    log.warning("terminal write failed during shutdown", action="complete",
                                job_id=job.row.id, error=str(exc))
                    return
                log.warning("terminal write failed; retrying", action="complete",
                            job_id=job.row.id, error=str(exc))
                await asyncio.sleep(next(waits))
        log.info("job finished", action="complete", job_id=job.row.id,
                 status=str(completion.status), error_kind=completion.error_kind,
                 applied=written is not None)
        if written is None:
            # The row is not ours to end any more (a peer adopted or re-queued the job while
            # this instance was stopped or cut off): the spool is the new owner's evidence,
            # its end record above all. Deleting it here made the owner's finalize read "the
            # supervisor ended without recording how" (retention purges what is left).
            return
        job.terminal = written
        job.spool_settled = True  # drive() removes the spool
        for listener in self.end_listeners:
            listener()

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


def _progress_tails(execution: Execution) -> tuple[str, str]:
    """The stdout and stderr tails a progress flush writes (file reads: run in a thread)."""
    return (execution.read_stdout_tail(PROGRESS_TAIL_BYTES),
            execution.read_stderr_tail(STDERR_TAIL_BYTES))
