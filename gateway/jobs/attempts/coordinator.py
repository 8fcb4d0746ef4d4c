"""The lifecycle of attempt groups after admission: each attempt's check, and the group's end.

One coordinator per gateway sweeps the running groups of its host (every gateway on the host
may: each step below is a compare-and-set in the store, so of any number of sweepers one
acts). For each attempt whose job has ended:

- its check still `pending`: skipped with the reason when it never runs (the group has no
  check, the job did not complete, it changed nothing, its worktree is gone), else claimed
  (`claim_check`: this gateway runs it, once) and started under a supervisor (checks.py);
- its check `running` and not watched here: its end record, when there is one, is recorded
  (a gateway killed mid-check, a window closed: the supervisor ran on and wrote it); a claim
  whose claimer is gone and whose supervisor never started is taken (no supervisor will run
  it late) and recorded `interrupted`; one whose supervisor died without an end record too.

A group whose every job ended and every check has its result (or was skipped) ends `done`
with the winner the ranking names (compare-and-set running -> done). `until =
"first_passing"`: once one check passes, the other attempts still running are cancelled
through the manager's cancel, and when the group ends the worktrees of all but the winner are
discarded (worktrees/changes.py, the code of `llm_job_changes`).

A group with a judge (judge.py) whose attempts have all ended and been checked, with at
least two qualifying, starts one more job, the judge, and ends only when it has: the judged
attempt wins when the answer names a qualifying one, else the deterministic winner stays and
`judge.error` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from gateway import proc
from gateway.backoff import Backoff, woken_or_after
from gateway.jobs.attempts import checks, judge
from gateway.jobs.attempts.comparison import attempt_view, ranked
from gateway.jobs.attempts.ranking import NO_CHECK, PASSED, Ranking
from gateway.jobs.manager import JobManager
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.runner import ProcessRun
from gateway.jobs.run.spec import RunClaimedElsewhere
from gateway.jobs.worktrees import changes
from gateway.jobs.worktrees.finish import worktree_of
from gateway.model import ErrorKind, GatewayError, InstanceRow, JobRow, JobStatus
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    CheckState,
    GroupEnd,
    GroupStatus,
)
from gateway.store.base import StoreUnavailable

log = structlog.get_logger(__name__)

BUSY_TICK_S = 0.25  # between sweeps while a group of this host runs
# Otherwise from IDLE_TICK_S, doubling up to IDLE_TICK_MAX_S while nothing runs: a check
# left by a gone gateway waits at most that long; an attempt that ends here pokes at once
# (JobManager.on_job_end), and idle windows on one PostgreSQL read it seldom.
IDLE_TICK_S = 2.0
IDLE_TICK_MAX_S = 15.0
GROUPS_PER_SWEEP = 100


def skip_reason(group: AttemptGroupRow, job: JobRow) -> str | None:
    """Why an ended attempt gets no check (None: it gets one)."""
    if group.check_argv is None:
        return "no_check"
    if job.status is not JobStatus.COMPLETED:
        return f"attempt_{job.status}"
    worktree = worktree_of(job.request_json, job.result_json) or {}
    if not worktree.get("changed"):
        return "no_changes"
    if not worktree.get("path"):
        return "worktree_gone"
    return None


class AttemptCoordinator:
    """Sweeps this host's running attempt groups; runs the checks it claims."""

    def __init__(self, manager: JobManager,
                 owner_gone: Callable[[InstanceRow | None], bool]) -> None:
        self.manager = manager
        self.store = manager.store
        self.settings = manager.settings
        self.owner_gone = owner_gone
        self._runs: dict[str, ProcessRun] = {}  # job id -> the check run watched here
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        manager.on_job_end(self.poke)  # an attempt that ended here is checked at once

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="attempt-coordinator")

    def poke(self) -> None:
        """Sweep now (an attempt ended here, a group was admitted)."""
        self._wake.set()

    async def stop(self, detach: bool) -> None:
        """Stop sweeping. `detach`: the checks run on under their supervisors (the next
        gateway records them); else they are stopped, and recorded as such."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for run in list(self._runs.values()):
            if detach:
                run.detach()
            else:
                run.cancel(ErrorKind.SHUTDOWN)
        tasks = list(self._tasks.values())
        if detach:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.limits.kill_grace_s + 5.0)

    async def _loop(self) -> None:
        idle = 0  # sweeps in a row with no group of this host running
        while True:
            busy = False
            try:
                busy = await self.sweep()
            except StoreUnavailable as exc:
                log.warning("attempt sweep: store unavailable", action="attempts_sweep",
                            error=str(exc))
            except Exception:
                log.exception("attempt sweep failed", action="attempts_sweep")
            self._wake.clear()
            idle = 0 if busy else idle + 1
            await woken_or_after(self._wake, BUSY_TICK_S if busy else Backoff(
                first_s=IDLE_TICK_S, max_s=IDLE_TICK_MAX_S).delay(idle))

    # -- one sweep -------------------------------------------------------------------------
    async def sweep(self) -> bool:
        """One pass over the running groups; True when one of this host still runs."""
        if self.manager.admission.closing:
            return False
        groups = await self.store.list_attempt_groups(status=GroupStatus.RUNNING,
                                                      limit=GROUPS_PER_SWEEP)
        owners: dict[str, InstanceRow] | None = None
        busy = False
        for group in groups:
            attempts = await self.store.list_attempts(group.group_id)
            jobs = {}
            for attempt in attempts:
                job = await self.store.get_job(attempt.job_id, with_output=False)
                if job is not None:
                    jobs[attempt.job_id] = job
            if any(job.hostname != self.manager.hostname for job in jobs.values()):
                continue  # its worktrees are another host's: that host's gateways check it
            busy = True
            for attempt in attempts:
                job = jobs.get(attempt.job_id)
                if job is None or job.status.is_active:
                    continue
                if attempt.check_state is CheckState.PENDING:
                    await self._settle_pending(group, attempt, job)
                elif (attempt.check_state is CheckState.RUNNING
                      and attempt.job_id not in self._tasks):
                    if owners is None:
                        owners = {i.instance_id: i for i in await self.store.list_instances()}
                    await self._settle_unwatched(attempt, owners)
            await self._maybe_end(group)
        return busy

    async def _settle_pending(self, group: AttemptGroupRow, attempt: AttemptRow,
                              job: JobRow) -> None:
        reason = skip_reason(group, job)
        if reason is not None:
            await self.store.skip_check(attempt.job_id, reason)
            return
        if not await self.store.claim_check(attempt.job_id, self.manager.instance_id):
            return  # another gateway claimed it: it runs it
        worktree = (worktree_of(job.request_json, job.result_json) or {}).get("path")
        assert group.check_argv is not None and isinstance(worktree, str)
        self._tasks[attempt.job_id] = asyncio.create_task(
            self._run_check(attempt.job_id, group.check_argv, worktree,
                            group.check_timeout_s), name=f"check-{attempt.job_id}")

    async def _run_check(self, job_id: str, argv: list[str], worktree: str,
                         timeout_s: float) -> None:
        """Run one claimed check to its result; the result is written by whoever reads the
        end record first (this task, or the next gateway's sweep if this one goes)."""
        directory = checks.check_dir(self.settings, job_id)
        result: CheckResult | None = None
        try:
            await asyncio.to_thread(checks.prepare_dir, self.settings, job_id)
            run = ProcessRun(checks.run_spec(self.settings, job_id, argv, worktree, timeout_s))
            self._runs[job_id] = run
            await run.start()
            outcome = await run.wait()
            result = await asyncio.to_thread(checks.result_in, directory) or CheckResult(
                None, await asyncio.to_thread(checks.output_tail, directory),
                outcome.duration_s, outcome.error_kind or "no_end_record")
        except RunClaimedElsewhere:
            return
        except GatewayError as err:
            result = CheckResult(None, err.message, 0.0, str(err.kind))
        except OSError as exc:
            result = CheckResult(None, str(exc), 0.0, "launch_failed")
        finally:
            self._runs.pop(job_id, None)
            self._tasks.pop(job_id, None)
        await self._record(job_id, result)

    async def _record(self, job_id: str, result: CheckResult) -> None:
        try:
            recorded = await self.store.record_check(job_id, result)
        except StoreUnavailable:
            return  # the end record stays: the next sweep records it
        if recorded:
            log.info("attempt checked", action="attempt_check", job_id=job_id,
                     exit_code=result.exit_code, reason=result.reason)
        await asyncio.to_thread(checks.remove_dir, self.settings, job_id)
        self.poke()

    async def _settle_unwatched(self, attempt: AttemptRow,
                                owners: dict[str, InstanceRow]) -> None:
        """A running check nobody here watches: its claimer may be gone."""
        directory = checks.check_dir(self.settings, attempt.job_id)
        result = await asyncio.to_thread(checks.result_in, directory)
        if result is not None:
            await self._record(attempt.job_id, result)
            return
        claimer = attempt.check_claimed_by
        if claimer == self.manager.instance_id or not self.owner_gone(owners.get(claimer or "")):
            return  # its claimer lives and watches it
        claim = sup.read_record(directory, sup.START_NAME)
        if claim is None:
            if await asyncio.to_thread(checks.take_unstarted, directory,
                                       self.manager.instance_id):
                await self._record(attempt.job_id, CheckResult(
                    None, "", 0.0, "interrupted: its gateway went before it started"))
            return
        if claim.get("kind") != "supervisor":
            return  # taken by another sweeper, which records it
        pid, started = claim.get("pid"), claim.get("started_at")
        if (isinstance(pid, int) and isinstance(started, (int, float))
                and not proc.is_process_alive(pid, float(started))):
            await self._record(attempt.job_id, CheckResult(
                None, await asyncio.to_thread(checks.output_tail, directory), 0.0,
                "interrupted: its supervisor died without recording an end"))

    # -- the group's end -------------------------------------------------------------------
    async def _maybe_end(self, group: AttemptGroupRow) -> None:
        attempts = await self.store.list_attempts(group.group_id)
        jobs = [await self.store.get_job(a.job_id, with_output=False) for a in attempts]
        if group.until == "first_passing" and any(
                a.check_state is CheckState.DONE and a.check_exit_code == 0 for a in attempts):
            for job in jobs:
                if job is not None and job.status.is_active:
                    with contextlib.suppress(GatewayError, StoreUnavailable):
                        await self.manager.cancel(job.id)
            for attempt in attempts:  # a check not run yet never will: the group has won
                if attempt.check_state is CheckState.PENDING:
                    await self.store.skip_check(attempt.job_id, "group_decided")
            attempts = await self.store.list_attempts(group.group_id)
            jobs = [await self.store.get_job(a.job_id, with_output=False) for a in attempts]
        if any(job is None or job.status.is_active for job in jobs):
            return
        if any(a.check_state in (CheckState.PENDING, CheckState.RUNNING) for a in attempts):
            return
        views = [await attempt_view(self.store, self.manager.hostname, group, attempt, job)
                 for attempt, job in zip(attempts, jobs, strict=True) if job is not None]
        _, ranking = ranked(views, group.check_argv is not None)
        winner, reason, judged = ranking.winner, ranking.reason, None
        if group.judge is not None:
            decided = await self._judge(group, ranking, [j for j in jobs if j is not None])
            if decided is None:
                return  # the judge still runs (or was just started)
            judged = decided
            if decided.get("pick") is not None:
                winner = decided["pick"]
                reason = f"judge ({group.judge.get('provider')}): {decided.get('reason')}"
        ended = await self.store.end_attempt_group(GroupEnd(
            group.group_id, (GroupStatus.RUNNING,), GroupStatus.DONE,
            winner_job_id=winner, winner_reason=reason, judge_result=judged))
        if not ended:
            return
        log.info("attempt group done", action="attempts_done", group_id=group.group_id,
                 winner=winner)
        if group.until == "first_passing" and winner is not None:
            await discard_all_but(self.manager.hostname,
                                  [job for job in jobs if job is not None], winner)

    # -- the judge (judge.py) --------------------------------------------------------------
    async def _judge(self, group: AttemptGroupRow, ranking: Ranking,
                     jobs: list[JobRow]) -> dict[str, Any] | None:
        """The judge's result to record with the group's end, or None while it runs."""
        wanted = PASSED if group.check_argv is not None else NO_CHECK
        qualifying = [row.evidence.job_id for row in ranking.rows if row.rank == wanted]
        if len(qualifying) < 2:
            return {"status": "not_run", "pick": None, "reason": None,
                    "error": f"{len(qualifying)} qualifying attempt(s): nothing to judge"}
        if group.judge_job_id is None:
            return await self._start_judge(group, qualifying, jobs)
        job = await self.store.get_job(group.judge_job_id, with_output=False)
        if job is not None and job.status.is_active:
            return None
        result: dict[str, Any] = {"status": str(job.status) if job else "gone", "pick": None,
                                  "reason": None}
        failure = judge.judge_failure(job)
        if failure is not None:
            return {**result, "error": failure}
        page = await self.store.read_output(group.judge_job_id, 0, judge.ANSWER_CHARS,
                                            answer=True)
        answer = page[0].decode("utf-8", errors="replace") if page else ""
        try:
            pick, why = judge.verdict(answer, qualifying)
        except judge.InvalidVerdict as invalid:
            return {**result, "error": str(invalid)}
        return {**result, "pick": pick, "reason": why}

    async def _start_judge(self, group: AttemptGroupRow, qualifying: list[str],
                           jobs: list[JobRow]) -> dict[str, Any] | None:
        """Submit the judge's job and claim it on the group row (set once: of any number of
        gateways one sets it; a loser whose job differs cancels its own)."""
        by_id = {job.id: job for job in jobs}
        attempts = {a.job_id: a for a in await self.store.list_attempts(group.group_id)}
        candidates = [await asyncio.to_thread(
            self._candidate, by_id[job_id], attempts[job_id].check_output_tail)
            for job_id in qualifying]
        assert group.judge is not None
        request = judge.judge_request(group, judge.judge_prompt(group, candidates),
                                      self.settings.attempts.judge_timeout_s)
        try:
            submitted = await self.manager.submit(str(group.judge["provider"]), request)
        except GatewayError as err:
            return {"status": "not_run", "pick": None, "reason": None,
                    "error": f"the judge could not start: {err.message}"}
        job_id = submitted.job.id
        claimed = await self.store.end_attempt_group(GroupEnd(
            group.group_id, (GroupStatus.RUNNING,), GroupStatus.RUNNING, judge_job_id=job_id))
        if claimed:
            log.info("attempt group judged by a job", action="attempts_judge",
                     group_id=group.group_id, job_id=job_id)
        else:
            current = await self.store.get_attempt_group(group.group_id)
            if current is None or current.judge_job_id != job_id:
                with contextlib.suppress(GatewayError, StoreUnavailable):
                    await self.manager.cancel(job_id)
        return None

    def _candidate(self, job: JobRow, check_tail: str | None) -> judge.Candidate:
        """One qualifying attempt for the judge's prompt: its patch, capped."""
        cap = self.settings.attempts.judge_max_diff_bytes
        try:
            page = changes.diff(job, self.manager.hostname, fmt="patch", max_bytes=cap)
            text, cut = page.text, page.next_offset is not None
        except GatewayError as err:
            text, cut = f"(the diff could not be read: {err.message})", False
        tail = (check_tail or "")[-judge.CHECK_TAIL_CHARS:] or None
        return judge.Candidate(job.id, job.provider, job.model, text, cut, tail)


async def discard_all_but(hostname: str, jobs: list[JobRow], keep: str | None) -> list[
        dict[str, Any]]:
    """Discard the kept worktrees of every attempt but `keep` (llm_job_changes' discard);
    what each discard answered, or why it could not."""
    done = []
    for job in jobs:
        if job.id == keep:
            continue
        worktree = worktree_of(job.request_json, job.result_json) or {}
        if not worktree.get("changed") or worktree.get("state") not in (None, "kept"):
            continue
        try:
            done.append(await asyncio.to_thread(changes.discard, job, hostname))
        except GatewayError as err:
            done.append({"job_id": job.id, "discarded": False, "error": err.message})
    return done
