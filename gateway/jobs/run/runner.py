"""Runs one provider invocation under its supervisor (docs/architecture.md, Running a provider).

`ProcessRun(spec)`: `await start()` writes the run's spec into its spool dir and starts the
supervisor (`supervisor.py`) with the gateway's own interpreter in a new session, so the
supervisor leads the run's process group; the supervisor starts the CLI (argv list, never a
shell) with stdout and stderr on two spool files (`<spool_dir>/stdout`, `<spool_dir>/stderr`):
the event loop copies no bytes, memory stays flat, partial output can be read while the run
goes on, and it outlives the gateway. `await wait()` returns the `RunOutcome` once the
supervisor has recorded the run's end and the whole group is gone; `cancel()` asks for a stop.
`ProcessRun.attach(spec, identity)` watches a run another gateway started (adoption).

The run's rules (wall clock, idle timeout, output cap, the SIGTERM-then-SIGKILL escalation
over the whole group) are the supervisor's alone: they must hold while no gateway lives. The
gateway asks it to stop (a stop request file, then SIGTERM) and only steps in itself when the
supervisor is gone and members of its group are not, or when a stop or the wall clock is
overdue by more than the supervisor's worst case (it may be stopped): then it SIGKILLs the
group.

A gateway that leaves (crash, `detach()`) kills nothing: the supervisor runs on and the next
gateway on the host adopts the run. Cancelling the watching task inside a live gateway that
did not detach is not a leave, though: then the group is killed at once, so nothing leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import structlog

from gateway import platform, proc
from gateway.childenv import child_env
from gateway.jobs.run import spool
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.forks import ForkedExit, ForkUnanswered, Zygote
from gateway.jobs.run.record_to_outcome import (
    RunOutcome,
    outcome_from_record,
    stop_message,
    unstarted_outcome,
)
from gateway.jobs.run.spawned import Spawned, priority_targets
from gateway.jobs.run.spec import (
    ProcessIdentity,
    RunClaimedElsewhere,
    RunSpec,
    directories_error,
)
from gateway.model import ErrorKind, GatewayError

log = structlog.get_logger(__name__)

# How often the spool files are stat()ed for live progress, and an adopted supervisor (not
# our child: no exit notification) is checked for its end record and its liveness.
WATCH_INTERVAL_S = 0.1
# How long a stop may take past its grace before the gateway SIGKILLs the group itself: the
# supervisor escalates at the grace and polls every 50 ms, so only a supervisor that is
# stopped or dead lets this pass.
STOP_BACKSTOP_S = 1.0
# Past timeout_s + kill_grace_s + this, the gateway stops a run's group itself (a supervisor
# that is stopped enforces nothing, issue 23 item 6). Longer than the supervisor's own worst
# case after its grace (it waits up to REAP_TIMEOUT_S for members to vanish) plus a late tick.
WALL_BACKSTOP_MARGIN_S = sup.REAP_TIMEOUT_S + 2.0
# An adopted supervisor exits right after writing its end record (a temp dir to remove at
# most): how long to let it before its group counts as left behind.
SUPERVISOR_EXIT_WAIT_S = 2.0
# After the gateway's own SIGKILL: how long to wait for the group to vanish.
REAP_TIMEOUT_S = 5.0
# How long start() waits for the run's claim when a zygote that took the run was replaced
# (which supervisor runs it, only the claim says): a forked supervisor claims within a
# millisecond or two on a quiet box.
SUPERVISOR_START_TIMEOUT_S = 10.0
CLAIM_POLL_S = 0.002  # how often the claim is looked for meanwhile
FULL_DISK_STOP_MESSAGE = (
    "The state filesystem is full (no space left for the provider's output under {spool}): "
    "the run was stopped and its output truncated to what was written. Free disk space and "
    "rerun the request.")
# This process's zygote: it forks each run's supervisor (zygote.py, forks.py).
ZYGOTE = Zygote()


def resolve_command(command: str, path: str) -> str | None:
    """The executable `command` names (a path, or a name searched on `path`); None if none."""
    if os.sep in command:
        candidate = os.path.abspath(command)
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    return shutil.which(command, path=path)


class ProcessRun:
    """One invocation under its supervisor, from spawn until the whole group is gone."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.stdout_path = spool.stdout_path(spec.spool_dir)
        self.stderr_path = spool.stderr_path(spec.spool_dir)
        self._identity: ProcessIdentity | None = None
        self._watcher: asyncio.Task[RunOutcome] | None = None
        self._stop: tuple[ErrorKind, str] | None = None
        self._stop_at: float | None = None  # monotonic deadline of the stop's grace
        self._backstop_at: float | None = None  # monotonic: past it the gateway kills the run
        self._finished = False
        self._detached = False
        self._temp_dir: Path | None = None
        self._stdout_bytes = 0
        self._stderr_bytes = 0
        self._exit: ForkedExit | None = None
        self._wake = asyncio.Event()

    @classmethod
    def attach(cls, spec: RunSpec, identity: ProcessIdentity) -> ProcessRun:
        """Watch a run that another (gone) gateway started: its supervisor is not our child,
        so its end is learned by polling its end record and its liveness."""
        run = cls(spec)
        run._identity = identity
        claim = sup.read_record(spec.spool_dir, sup.START_NAME) or {}
        # The run began at its claim.
        began = float(claim.get("at") or identity.started_at)
        run._backstop_at = time.monotonic() + run._wall_backstop_s() - (time.time() - began)
        run._watcher = asyncio.create_task(run._watch(None), name=f"run-watch:{spec.job_id}")
        return run

    # -- public surface ----------------------------------------------------------------------

    @property
    def identity(self) -> ProcessIdentity | None:
        return self._identity

    @property
    def stdout_bytes(self) -> int:
        """stdout size at the last check (live progress; exact once wait() returned)."""
        return self._stdout_bytes

    @property
    def stderr_bytes(self) -> int:
        return self._stderr_bytes

    @property
    def finished(self) -> bool:
        return self._finished

    async def start(self) -> ProcessIdentity:
        """Start the supervisor; returns its pid, pgid and start time once it runs.

        Raises GatewayError: INVALID_INPUT (bad working_dir or empty argv), NOT_FOUND (the
        command is not installed; the message carries the install hint), LAUNCH_FAILED (the
        OS refused to start the supervisor), or the stop's kind if cancel() came first.
        """
        if self._watcher is not None:
            raise RuntimeError("ProcessRun.start() called twice")
        if self._stop is not None:
            raise GatewayError(*self._stop)
        argv = list(self.spec.invocation.argv)
        if not argv or not argv[0]:
            raise GatewayError(ErrorKind.INVALID_INPUT, "The invocation has no command to run.")
        spawned = await self._spawn(argv)
        pid = spawned.pid
        # On the loop, before anything can await: from here its exit is watched.
        self._exit = ForkedExit(spawned.link, pid, spawned.started_at)
        # Forked into a session of its own (fork_session): its pid is the pgid; asking
        # getpgid() would fail once it is reaped.
        self._identity = ProcessIdentity(pid=pid, pgid=pid, started_at=spawned.started_at)
        self._backstop_at = time.monotonic() + self._wall_backstop_s()
        self._watcher = asyncio.create_task(self._watch(self._exit),
                                            name=f"run-watch:{self.spec.job_id}")
        log.info("provider process started", action="run_start", job_id=self.spec.job_id,
                 pid=pid, command=os.path.basename(spawned.executable),
                 temp_cwd=self._temp_dir is not None)
        return self._identity

    async def wait(self) -> RunOutcome:
        """The outcome, once the run is over and its whole process group is gone.

        Cancelling the caller of wait() does not stop the run (use cancel() for that).
        """
        if self._watcher is None:
            raise RuntimeError("ProcessRun.wait() called before start()")
        return await asyncio.shield(self._watcher)

    def cancel(self, reason: ErrorKind = ErrorKind.CANCELLED, message: str | None = None,
               *, grace_s: float | None = None) -> None:
        """Ask the run to stop: its supervisor SIGTERMs the group, SIGKILLs it after the grace.

        Idempotent: the first reason is the one wait() reports. A later call may only shorten
        the grace (e.g. a shutdown during a cancel's grace). `grace_s` defaults to the spec's
        kill_grace_s. After the CLI has exited by itself the outcome stays the provider's.
        """
        if self._finished:
            return
        grace = self.spec.kill_grace_s if grace_s is None else max(0.0, grace_s)
        deadline = time.monotonic() + grace
        if self._stop is None:
            self._stop = (reason, message or stop_message(reason, self.spec.limits))
            log.info("stop requested", action="run_stop_request", job_id=self.spec.job_id,
                     reason=str(reason), grace_s=grace)
        elif self._stop_at is not None and deadline >= self._stop_at:
            return  # a later stop can only bring the SIGKILL forward
        self._stop_at = deadline
        if self._identity is not None:
            self._ask_supervisor_to_stop(grace)
        self._wake.set()

    def detach(self) -> None:
        """The gateway leaves and the run goes on: stop watching without killing anything
        (also while the supervisor is being started: it runs on and is adopted)."""
        self._detached = True
        if self._watcher is not None:
            self._watcher.cancel()

    # -- spawn --------------------------------------------------------------------------------

    async def _spawn(self, argv: list[str]) -> Spawned:
        """Prepare the spool dir and have the zygote fork the run's supervisor, on the loop.

        No thread hop: what is left to do here takes tens of microseconds (a stat or two, the
        cached PATH search, mkdtemp, writing run.json; the fork happens in the zygote), while
        two thread wakes cost a sync request about half a millisecond (bench/README.md, the
        cost rows). Once the fork request is sent, the forking goes on in a task of its own
        whatever happens to start(): if start() is cancelled (and the gateway does not
        leave), the supervisor it forked is killed once its pid is known. Never a leak."""
        executable, env, cwd = self._prepare(argv)
        try:
            token = self._write_spec([executable, *argv[1:]], cwd)
        except FileNotFoundError:
            self._remove_temp_dir()
            raise RunClaimedElsewhere(self.spec.job_id) from None  # removed since _prepare
        except BaseException:
            self._remove_temp_dir()
            raise
        forking = asyncio.get_running_loop().create_task(
            self._fork(token, env, executable), name=f"fork:{self.spec.job_id}")
        try:
            return await asyncio.shield(forking)
        except asyncio.CancelledError:
            forking.add_done_callback(self._discard_forked)
            raise

    def _discard_forked(self, forking: asyncio.Future[Spawned]) -> None:
        """What a cancelled start() forked: killed, unless the gateway leaves (then the
        supervisor runs on and is adopted). A failure to fork left nothing to kill."""
        if forking.cancelled() or forking.exception() is not None or self._detached:
            return
        self._discard(forking.result())

    def _prepare(self, argv: list[str]) -> tuple[str, dict[str, str], str]:
        """Validate and make the run's working dir: (the executable, the child's environment,
        the cwd). Raises GatewayError, RunClaimedElsewhere."""
        spec = self.spec
        env = child_env(spec.secret_env, spec.invocation.env)
        if spec.working_dir is not None and not Path(spec.working_dir).is_dir():
            raise GatewayError(
                ErrorKind.INVALID_INPUT,
                f"working_dir {spec.working_dir!r} does not exist or is not a directory; "
                "pass an existing directory (or omit it to run in a fresh temp dir).",
            )
        executable = resolve_command(argv[0], env["PATH"])
        if executable is None:
            raise self._not_found(argv[0])
        if not spec.spool_dir.is_dir():
            # Made before the queued -> running CAS (the manager) and never here: gone means
            # a gateway that judged this one gone re-queued the job meanwhile, and may have
            # run it already. Recreating it would launch the run twice (spool.run_dir).
            raise RunClaimedElsewhere(spec.job_id)
        if spec.working_dir is not None:
            return executable, env, spec.working_dir
        try:  # EACCES, ENOSPC, EROFS on the temp dir: a clear failure
            self._temp_dir = spool.make_temp_cwd(spec.spool_dir)
        except FileNotFoundError:
            raise RunClaimedElsewhere(spec.job_id) from None  # removed since the check above
        except OSError as exc:
            raise GatewayError(ErrorKind.LAUNCH_FAILED, directories_error(exc)) from None
        return executable, env, str(self._temp_dir)

    def _write_spec(self, argv: list[str], cwd: str) -> str:
        """run.json (and the stdin payload) for the supervisor; returns the launch token
        that ties this supervisor to this spec (a re-queued run gets a new one)."""
        spec = self.spec
        token = secrets.token_hex(16)
        nice, autogroup = priority_targets(spec.provider_nice)
        payload = spec.invocation.stdin
        if payload is not None:
            fd = os.open(spec.spool_dir / sup.STDIN_NAME,
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        sup.write_record(spec.spool_dir, sup.RUN_NAME, {
            "version": sup.RECORD_VERSION, "token": token, "job_id": spec.job_id,
            "argv": argv, "cwd": cwd, "temp_cwd": self._temp_dir is not None,
            "stdin": payload is not None, "timeout_s": spec.timeout_s,
            "idle_timeout_s": spec.idle_timeout_s, "max_output_bytes": spec.max_output_bytes,
            "kill_grace_s": spec.kill_grace_s, "nice": nice, "autogroup_nice": autogroup,
            **platform.supervisor_spec(),
        })
        return token

    async def _fork(self, token: str, env: dict[str, str], executable: str) -> Spawned:
        """The run's supervisor, forked by the zygote (its priority is the zygote's, lowered
        at its start; it sets the run's own values itself, absolute, and retries the
        autogroup). Raises GatewayError(LAUNCH_FAILED); the temp dir goes with a failure
        that leaves nothing running. Not with a cancel: the loop closing under a gateway
        that leaves cancels this while the zygote may have forked the run's supervisor
        already, and the run, working in that dir, is adopted by the next gateway."""
        try:
            spawned, replaced = await self._forked(token, env, executable)
        except (GatewayError, RunClaimedElsewhere):
            self._remove_temp_dir()
            raise
        if not replaced:
            # Not waited for: the run is the supervisor's from its fork on. A gateway that
            # dies before the claim leaves a run that an adopter claims for a re-queue first
            # (then this supervisor never starts it) or finds claimed: it is launched once.
            return spawned
        try:  # which supervisor runs it, only the claim says
            await self._await_claim(spawned)
        except BaseException:
            self._discard(spawned)  # nobody would ever watch it
            raise
        return self._claimant(spawned, token)

    async def _forked(self, token: str, env: dict[str, str], executable: str
                      ) -> tuple[Spawned, bool]:
        """The supervisor the zygote forked, and whether a zygote that took the run was
        replaced meanwhile."""
        replaced = False
        for _ in range(2):
            try:
                pid, link = await ZYGOTE.fork(self.spec.spool_dir, token, env)
                break
            except ForkUnanswered:
                # Replaced; the same run (same token) goes to the new zygote. If the old
                # one forked it after all, both supervisors race for the one claim, and the
                # run's supervisor is whichever won (_claimant): never a second launch.
                replaced = True
        else:
            return await self._settle_unanswered_fork(executable, token), True
        # An instant run may have been reaped already, its pid reused: a start time that is
        # not its own makes every later liveness check of this identity say "gone", which is
        # what it is; without one (no such process) the spawn time serves as well.
        started_at = proc.process_start_time(pid) or time.time()
        return Spawned(pid=pid, link=link, started_at=started_at, executable=executable), replaced

    async def _settle_unanswered_fork(self, executable: str, token: str) -> Spawned:
        """Two zygotes in a row took the run and died or stopped answering: whether either
        forked a supervisor, the run's claim says, now or once the run is claimed for
        nobody. Never a second launch: one spool, one claim."""
        spool_dir = self.spec.spool_dir
        deadline = time.monotonic() + SUPERVISOR_START_TIMEOUT_S
        while sup.read_record(spool_dir, sup.START_NAME) is None:
            if time.monotonic() >= deadline:
                try:
                    sup.claim_record(spool_dir, sup.START_NAME, {
                        "version": sup.RECORD_VERSION, "kind": "unstarted",
                        "at": time.time(), "zygote": "unanswered"})
                except FileNotFoundError:
                    raise RunClaimedElsewhere(self.spec.job_id) from None
                break  # ours, or a supervisor's that came at the last moment
            await asyncio.sleep(CLAIM_POLL_S)
        claim = sup.read_record(spool_dir, sup.START_NAME) or {}
        if claim.get("kind") != "supervisor":
            raise GatewayError(ErrorKind.LAUNCH_FAILED, "The run's supervisor could not be "
                               "started (the gateway's zygote stopped answering): nothing "
                               "ran. Resubmit the request.")
        if claim.get("token") != token:
            raise RunClaimedElsewhere(self.spec.job_id)
        return Spawned.from_claim(claim, executable)  # a supervisor of ours runs it

    def _claimant(self, spawned: Spawned, token: str) -> Spawned:
        """The supervisor that holds this launch's claim: `spawned`, or one that a replaced
        zygote forked for the same launch (the same token) and that won the claim; ours then
        exits without running anything. Its zygote is gone, so its exit is polled."""
        claim = sup.read_record(self.spec.spool_dir, sup.START_NAME) or {}
        if (claim.get("kind") != "supervisor" or claim.get("token") != token
                or claim.get("pid") == spawned.pid):
            return spawned
        spawned.on_exit(lambda _status: None)  # the loser's exit: nobody waits for it
        log.info("the run's supervisor is one a replaced zygote forked", action="zygote",
                 job_id=self.spec.job_id, pid=claim.get("pid"))
        return Spawned.from_claim(claim, spawned.executable)

    async def _await_claim(self, spawned: Spawned) -> None:
        """Until the supervisor has claimed the run (or exited)."""
        deadline = time.monotonic() + SUPERVISOR_START_TIMEOUT_S
        path = self.spec.spool_dir / sup.START_NAME
        while not path.exists() and time.monotonic() < deadline:
            if spawned.exited():
                return
            await asyncio.sleep(CLAIM_POLL_S)

    def _discard(self, spawned: Spawned) -> None:
        """Kill a supervisor that start() will never watch; its temp dir goes once it is gone."""
        proc.signal_group(spawned.pid, signal.SIGKILL)
        spawned.on_exit(lambda _status: self._remove_temp_dir())

    def _not_found(self, command: str) -> GatewayError:
        hint = self.spec.install_hint.strip().rstrip(".")
        how = f"Install it ({hint})" if hint else "Install it"
        return GatewayError(
            ErrorKind.NOT_FOUND,
            f"The '{command}' command was not found. {how} and make sure it is on PATH.",
        )

    def _remove_temp_dir(self) -> None:
        # Taken first: the concluding thread and a cancelled watcher may both get here.
        temp_dir, self._temp_dir = self._temp_dir, None
        if temp_dir is not None and temp_dir.exists():  # mostly its supervisor removed it
            shutil.rmtree(temp_dir, ignore_errors=True)

    # -- watching ------------------------------------------------------------------------------

    def _ask_supervisor_to_stop(self, grace: float) -> None:
        """The stop request file, then SIGTERM to the supervisor alone (it escalates)."""
        assert self._identity is not None and self._stop is not None
        kind, message = self._stop
        try:
            sup.write_record(self.spec.spool_dir, sup.STOP_NAME, {
                "version": sup.RECORD_VERSION, "kind": str(kind), "message": message,
                "grace_s": grace})
        except OSError as exc:
            log.warning("stop request not written", action="run_stop_request",
                        job_id=self.spec.job_id, error=str(exc))
        if self._supervisor_running():
            with contextlib.suppress(OSError):
                os.kill(self._identity.pid, signal.SIGTERM)

    def _wall_backstop_s(self) -> float:
        return self.spec.timeout_s + self.spec.kill_grace_s + WALL_BACKSTOP_MARGIN_S

    def _enforce_wall_backstop(self, pgid: int) -> None:
        """The supervisor enforces the wall clock; a stopped one (SIGSTOP) enforces nothing,
        so past its worst case the gateway kills the group itself, as a timeout (a SIGKILL
        ends a stopped supervisor too)."""
        if self._backstop_at is None or time.monotonic() < self._backstop_at:
            return
        self._backstop_at = None
        if self._stop is None:
            self._stop = (ErrorKind.TIMEOUT, stop_message(ErrorKind.TIMEOUT, self.spec.limits))
        log.warning("the run outlived its wall clock and its supervisor did not stop it; "
                    "killing its group", action="run_kill", job_id=self.spec.job_id, pgid=pgid)
        proc.signal_group(pgid, signal.SIGKILL)

    def _supervisor_running(self) -> bool:
        identity = self._identity
        if identity is None:
            return False
        if self._exit is not None:  # forked by our zygote, which reports its exit
            return not self._exit.exited.done()
        return proc.is_process_alive(identity.pid, identity.started_at)

    def _refresh_sizes(self) -> None:
        self._stdout_bytes = spool.file_size(self.stdout_path)
        self._stderr_bytes = spool.file_size(self.stderr_path)

    async def _watch(self, child: ForkedExit | None) -> RunOutcome:
        assert self._identity is not None
        pgid = self._identity.pgid
        try:
            while self._supervisor_running():
                if child is None and sup.read_record(self.spec.spool_dir, sup.END_NAME):
                    break  # adopted: the record is final once written
                woken = asyncio.ensure_future(self._wake.wait())
                waits: set[asyncio.Future[Any]] = {woken}
                if child is not None:
                    waits.add(child.exited)
                await asyncio.wait(waits, timeout=WATCH_INTERVAL_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                self._wake.clear()
                self._refresh_sizes()
                if child is not None:
                    child.check()  # its zygote may be stopped
                if self._stop is None and spool.filesystem_full(self.spec.spool_dir):
                    # The provider's writes fail (ENOSPC) and a CLI may carry on anyway: the
                    # run ends now, with the output written so far.
                    self.cancel(ErrorKind.OUTPUT_LIMIT,
                                FULL_DISK_STOP_MESSAGE.format(spool=self.spec.spool_dir))
                if (self._stop_at is not None
                        and time.monotonic() > self._stop_at + STOP_BACKSTOP_S):
                    log.warning("supervisor did not stop the run in time; killing its group",
                                action="run_kill", job_id=self.spec.job_id, pgid=pgid)
                    proc.signal_group(pgid, signal.SIGKILL)
                    self._stop_at = None
                self._enforce_wall_backstop(pgid)
            if child is not None:
                await child.exited
            else:  # the end record is written just before the supervisor exits
                deadline = time.monotonic() + SUPERVISOR_EXIT_WAIT_S
                while self._supervisor_running() and time.monotonic() < deadline:
                    await asyncio.sleep(WATCH_INTERVAL_S / 2)
            await self._reap_group(pgid)
            status = child.exited.result() if child is not None else None
            if self._left_tidy():  # two small records to read: on the loop, no thread hop
                outcome = self._conclude(status)
            else:  # a temp dir the supervisor could not remove may be large: a thread
                outcome = await asyncio.to_thread(self._conclude, status)
            log.info("provider process finished", action="run_end", job_id=self.spec.job_id,
                     exit_code=outcome.exit_code, error_kind=outcome.error_kind,
                     duration_s=round(outcome.duration_s, 3))
            return outcome
        except asyncio.CancelledError:
            if not self._detached:
                # Not a leave: the gateway lives on, so the group must not outlive us.
                proc.signal_group(pgid, signal.SIGKILL)
            raise
        finally:
            self._finished = True

    def _left_tidy(self) -> bool:
        """Whether the supervisor recorded the run's end and removed its temp working dir:
        what is left to conclude is reading two small records."""
        if not (self.spec.spool_dir / sup.END_NAME).exists():
            return False
        return self._temp_dir is None or not self._temp_dir.exists()

    def _claim_is_ours(self) -> bool:
        claim = sup.read_record(self.spec.spool_dir, sup.START_NAME)
        return (claim is not None and claim.get("kind") == "supervisor"
                and self._identity is not None and claim.get("pid") == self._identity.pid)

    async def _reap_group(self, pgid: int) -> None:
        """The supervisor is gone: anything left in its group (it was killed before it could
        stop the CLI) is killed, so nothing outlives the run."""
        if not proc.group_alive(pgid):
            return
        log.warning("the supervisor left processes behind; killing its group",
                    action="run_kill", job_id=self.spec.job_id, pgid=pgid)
        proc.signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while proc.group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(WATCH_INTERVAL_S / 2)

    def _claim_unstarted(self) -> bool:
        """No end record and no claim of our supervisor: when nobody claimed the run either,
        our supervisor died between its hand-over and its claim (an OOM kill at start) and
        nothing ran. Claim the run here (as a re-queue would), so that no supervisor can
        start it any more, and say True: the job is still ours to end. False: the claim is
        another gateway's (it re-queued the job), or the spool went with that re-queue."""
        spool_dir = self.spec.spool_dir
        if self._identity is None or sup.read_record(spool_dir, sup.START_NAME) is not None:
            return False
        try:  # claim_record, not claim_for_requeue: a removed spool must stay removed
            return sup.claim_record(spool_dir, sup.START_NAME, {
                "version": sup.RECORD_VERSION, "kind": "unstarted", "at": time.time(),
                "supervisor_pid": self._identity.pid})
        except FileNotFoundError:
            return False

    def _conclude(self, supervisor_status: int | None = None) -> RunOutcome:
        """The outcome from the end record, once the group is gone (file reads: a thread).
        `supervisor_status`: the supervisor's wait status when it was our child.

        Raises RunClaimedElsewhere when there is no end record because the supervisor never
        held the claim and another gateway does (claimed for a re-queue, or gone with the
        spool the re-queue replaced). A supervisor that died before anyone claimed the run
        ends it as never started (`_claim_unstarted`), never as someone else's: that left
        the job running for good while its gateway lived (issue 23, item 1)."""
        record = sup.read_record(self.spec.spool_dir, sup.END_NAME)
        if record is None and not self._claim_is_ours():
            self._remove_temp_dir()
            if not self._claim_unstarted():
                raise RunClaimedElsewhere(self.spec.job_id)
            log.warning("the run's supervisor died before it claimed the run; nothing ran",
                        action="run_unstarted", job_id=self.spec.job_id,
                        supervisor_status=supervisor_status)
            return unstarted_outcome(self.spec.spool_dir, self._stop, supervisor_status)
        outcome = outcome_from_record(self.spec.spool_dir, record, self.spec.limits, self._stop,
                                      supervisor_status)
        self._stdout_bytes, self._stderr_bytes = outcome.stdout_bytes, outcome.stderr_bytes
        self._remove_temp_dir()  # the supervisor removes it; not if it was killed first
        if record is None:
            spool.remove_temp_cwd(self.spec.spool_dir)  # an adopted run's, by its record
        return outcome
