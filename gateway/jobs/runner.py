"""Runs one provider invocation as its own process group (DESIGN.md section 5).

`ProcessRun(spec)`: `await start()` spawns the CLI (argv list, never a shell) in a new session,
so it leads its own process group; `await wait()` returns the `RunOutcome` once the run is over
and the whole group is gone; `cancel()` asks for a stop. stdout and stderr go straight into two
spool files (gateway/jobs/spool.py): the event loop copies no bytes, memory
stays flat whatever the output size, partial output can be read while the run goes on, and it
survives a gateway crash. A monitor loop stats those files to enforce the output cap and the
idle timeout, and watches the wall clock.

Every stop (cancel, timeouts, output cap, shutdown) is the same escalation: SIGTERM to the
whole group, then SIGKILL to the group after the grace, even if the leader has already exited,
so grandchildren that ignore SIGTERM die too. Output written during the grace is kept.

A gateway *crash* kills nothing: the group is in its own session and keeps writing its spool
files (DESIGN.md section 5). Cancelling the supervising task inside a live gateway is not a
crash, though; then the group is killed at once so that nothing leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gateway import proc
from gateway.childenv import child_env
from gateway.fs import ensure_private_dir
from gateway.jobs import spool
from gateway.jobs.child_exit import ChildExit, open_pidfd
from gateway.model import EXIT_CODES, ErrorKind, GatewayError
from providers.base import Invocation

log = structlog.get_logger(__name__)

# How often the spool files are stat()ed while the leader runs. Bounds how late the output cap,
# the idle timeout and the wall clock are noticed; two stat() calls per tick cost nothing.
MONITOR_INTERVAL_S = 0.1
# During a stop's grace (or after the leader's exit) how often the group is re-checked, so
# wait() returns soon after the last member exits instead of sitting out the whole grace.
GROUP_POLL_INTERVAL_S = 0.05
# After SIGKILL: how long to wait for the group's members to vanish before giving up with a
# warning. SIGKILL cannot be ignored; only uninterruptible sleep (e.g. a hung NFS read) delays it.
REAP_TIMEOUT_S = 5.0

ERROR_TAIL_BYTES = 4096  # how much of the end of stderr is read to quote a provider's error
ERROR_TAIL_LINES = 3  # how many last non-empty stderr lines become the error text
FULL_DISK_STOP_MESSAGE = (
    "The state filesystem is full (no space left for the provider's output under {spool}): "
    "the run was stopped and its output truncated to what was written. Free disk space and "
    "rerun the request.")
STDIN_CHUNK_BYTES = 64 * 1024  # one pipe buffer: the most a non-blocking write can take at once
TEMP_DIR_PREFIX = "agent-cli-gateway-run-"
# Provider CLIs run this many nice levels below the gateway, and so does each one's autogroup
# (proc.lower_priority). The gateway's heartbeat and MCP answers must not be starved by its
# own providers: with 32 CPU-bound ones, each in a session (autogroup) of its own, the gateway
# got ~1/34 of the CPU and answered 10-12 calls/s (128-143 with this); under load the chaos
# run saw ~1 s loop stalls that let peers orphan live jobs. Provider CLIs mostly wait on the
# network, so this costs them little: it decides who goes first when the CPU is short. 10 is
# what `nice` gives a background command.
PROVIDER_NICE_INCREMENT = 10


@dataclass(slots=True)
class RunSpec:
    job_id: str
    invocation: Invocation
    spool_dir: Path  # per-job directory; stdout/stderr are spooled to files in it
    working_dir: str | None  # must exist; None: a fresh private temp dir (removed after)
    timeout_s: float  # wall clock
    idle_timeout_s: float | None  # None: never idle-killed (providers that print at exit)
    max_output_bytes: int
    kill_grace_s: float
    # Variables of the gateway's environment the child must not see, besides AGENT_GATEWAY_*
    # (gateway.childenv.secret_env_names of the settings).
    secret_env: frozenset[str]
    install_hint: str = ""  # shown when the binary is missing


@dataclass(slots=True)
class ProcessIdentity:
    pid: int
    pgid: int
    started_at: float  # process start time (epoch seconds, psutil create_time)


@dataclass(slots=True)
class RunOutcome:
    exit_code: int | None  # the provider's own exit code, or the gateway's code (124...)
    error_kind: ErrorKind | None  # None on a clean exit 0
    error: str | None
    stdout_path: Path
    stderr_path: Path
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    duration_s: float
    signal: int | None = None  # set when the leader died of a signal
    extra: dict[str, object] = field(default_factory=dict)


# -- helpers: command lookup, messages ------------------------------------------------------


def resolve_command(command: str, path: str) -> str | None:
    """The executable `command` names (a path, or a name searched on `path`); None if none."""
    if os.sep in command:
        candidate = os.path.abspath(command)
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    return shutil.which(command, path=path)


def _resolve_once(future: asyncio.Future[None]) -> None:
    # A ready-callback can fire again before the awaiting task runs and removes it.
    if not future.done():
        future.set_result(None)


def _last_lines(text: str, count: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _default_stop_message(kind: ErrorKind, spec: RunSpec) -> str:
    if kind == ErrorKind.TIMEOUT:
        return (f"The run exceeded its wall-clock timeout of {spec.timeout_s:g} s and was "
                "stopped; pass a larger timeout_s (default: limits.default_timeout_s).")
    if kind == ErrorKind.IDLE_TIMEOUT:
        return (f"The provider wrote no output for {spec.idle_timeout_s or 0:g} s and was "
                "stopped (limits.idle_timeout_s).")
    if kind == ErrorKind.OUTPUT_LIMIT:
        return (f"Output exceeded the maximum of {spec.max_output_bytes} bytes "
                "(limits.max_output_bytes); the run was stopped and its output truncated.")
    if kind == ErrorKind.SHUTDOWN:
        return "The gateway shut down before the run finished."
    if kind == ErrorKind.CANCELLED:
        return "The run was cancelled."
    return f"The run was stopped ({kind})."


@dataclass(slots=True)
class _StopRequest:
    kind: ErrorKind
    message: str
    grace_s: float


@dataclass(slots=True)
class _Spawned:
    """A child just started by the spawn thread, not yet watched by the event loop."""

    popen: subprocess.Popen[bytes]
    pidfd: int | None
    started_at: float
    stdin_write_fd: int | None
    executable: str
    priority_lowered: bool = False  # False: proc.lower_priority asked to be called again


# -- the run -----------------------------------------------------------------------------------


class ProcessRun:
    """One invocation as a process group, from spawn until the whole group is gone."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.stdout_path = spool.stdout_path(spec.spool_dir)
        self.stderr_path = spool.stderr_path(spec.spool_dir)
        self._identity: ProcessIdentity | None = None
        self._supervisor: asyncio.Task[RunOutcome] | None = None
        self._stop: _StopRequest | None = None
        self._stop_requested = asyncio.Event()
        self._kill_at: float | None = None  # monotonic time of the SIGKILL, once SIGTERM is sent
        self._finished = False
        self._temp_dir: Path | None = None
        self._started_mono = 0.0
        self._last_growth_mono = 0.0
        self._stdout_bytes = 0
        self._stderr_bytes = 0
        self._stdin_task: asyncio.Task[None] | None = None
        self._stdin_incomplete = False
        self._exit: ChildExit | None = None
        # The spawn runs in a worker thread; if start() is cancelled meanwhile, whichever of
        # the two comes second (under this lock) kills the child it will never supervise.
        self._spawn_lock = threading.Lock()
        self._spawn_abandoned = False
        self._spawned: _Spawned | None = None
        self._priority_pending = False  # lowering the child's priority is to be retried

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
        """Spawn the invocation; returns its pid, pgid and start time.

        Raises GatewayError: INVALID_INPUT (bad working_dir or empty argv), NOT_FOUND (the
        command is not installed; the message carries the install hint), LAUNCH_FAILED (the
        OS refused to start it), or the stop's kind if cancel() came before start().
        """
        if self._supervisor is not None:
            raise RuntimeError("ProcessRun.start() called twice")
        if self._stop is not None:
            raise GatewayError(self._stop.kind, self._stop.message)
        spec = self.spec
        argv = list(spec.invocation.argv)
        if not argv or not argv[0]:
            raise GatewayError(ErrorKind.INVALID_INPUT, "The invocation has no command to run.")
        spawned = await self._spawn_off_loop(argv)
        self._spawned = None  # claimed: supervised from here on
        pid = spawned.popen.pid
        # On the loop, before anything can await: from here the exit is watched and reaped.
        self._exit = ChildExit(spawned.popen, spawned.pidfd)
        self._priority_pending = not spawned.priority_lowered
        self._started_mono = self._last_growth_mono = time.monotonic()
        # start_new_session=True made the leader's pid the pgid; asking getpgid() instead
        # would fail once the leader is reaped.
        self._identity = ProcessIdentity(pid=pid, pgid=pid, started_at=spawned.started_at)
        if spawned.stdin_write_fd is not None:
            payload = spec.invocation.stdin or b""
            self._stdin_task = asyncio.create_task(
                self._feed_stdin(spawned.stdin_write_fd, payload),
                name=f"run-stdin:{spec.job_id}")
        self._supervisor = asyncio.create_task(
            self._supervise(self._exit), name=f"run-supervise:{spec.job_id}")
        log.info("provider process started", action="run_start", job_id=spec.job_id,
                 pid=pid, command=os.path.basename(spawned.executable),
                 temp_cwd=self._temp_dir is not None)
        return self._identity

    async def wait(self) -> RunOutcome:
        """The outcome, once the run is over and its whole process group is gone.

        Cancelling the caller of wait() does not stop the run (use cancel() for that).
        """
        if self._supervisor is None:
            raise RuntimeError("ProcessRun.wait() called before start()")
        return await asyncio.shield(self._supervisor)

    def cancel(self, reason: ErrorKind = ErrorKind.CANCELLED, message: str | None = None,
               *, grace_s: float | None = None) -> None:
        """Ask the run to stop: SIGTERM to the group, SIGKILL after the grace.

        Idempotent: the first reason is the one wait() reports. A later call may only shorten
        the grace (e.g. a shutdown during a cancel's grace). `grace_s` defaults to the spec's
        kill_grace_s. After the leader has exited by itself the outcome stays the provider's.
        """
        if self._finished:
            return
        grace = self.spec.kill_grace_s if grace_s is None else max(0.0, grace_s)
        if self._stop is None:
            self._stop = _StopRequest(reason, message or _default_stop_message(reason, self.spec),
                                      grace)
            self._stop_requested.set()
            log.info("stop requested", action="run_stop_request", job_id=self.spec.job_id,
                     reason=str(reason), grace_s=grace)
        else:
            self._stop.grace_s = min(self._stop.grace_s, grace)
        self._shorten_grace(grace)

    def _shorten_grace(self, grace: float) -> None:
        # Once SIGTERM is out, a stop (or a later, more urgent one) can only bring the SIGKILL
        # forward, never push it back.
        if self._kill_at is not None:
            self._kill_at = min(self._kill_at, time.monotonic() + grace)

    # -- spawn helpers ------------------------------------------------------------------------

    async def _spawn_off_loop(self, argv: list[str]) -> _Spawned:
        """Run `_spawn_blocking` in a worker thread: the directory checks, the PATH search
        (user bin dirs are globbed), mkdir/mkdtemp, opening the spool files and fork/exec
        block for milliseconds each, and the event loop also answers every MCP request of
        this gateway."""
        loop = asyncio.get_running_loop()
        spawning = loop.run_in_executor(None, self._spawn_blocking, argv)
        try:
            return await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # The thread runs on: if it has spawned already, the child is killed here; if
            # not, the thread sees the flag and kills it itself. Never a leaked group.
            with self._spawn_lock:
                self._spawn_abandoned = True
                spawned, self._spawned = self._spawned, None
            if spawned is not None:
                self._discard(spawned)
            raise

    def _spawn_blocking(self, argv: list[str]) -> _Spawned:
        """Validate, prepare the directories and start the child (in a worker thread)."""
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

        cwd = spec.working_dir
        try:  # EACCES, ENOSPC, EROFS on the state dir or the temp dir: a clear failure
            ensure_private_dir(spec.spool_dir)  # and spool/ and the state dir, all 0700
            if cwd is None:  # mkdtemp: 0700, outside any repository (no project instructions)
                self._temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX))
                cwd = str(self._temp_dir)
        except OSError as exc:
            raise GatewayError(ErrorKind.LAUNCH_FAILED, f"Cannot prepare the run's directories "
                               f"({exc.strerror or exc}: {exc.filename}); the gateway's state "
                               f"directory must be writable by its user.") from None
        try:
            popen, stdin_write_fd = self._spawn(executable, argv, env, cwd)
        except BaseException:
            self._remove_temp_dir()
            raise
        # First thing after the spawn: until then the child runs at the gateway's priority.
        lowered = proc.lower_priority(popen.pid, PROVIDER_NICE_INCREMENT)
        spawned = _Spawned(popen=popen, pidfd=None, started_at=time.time(),
                           stdin_write_fd=stdin_write_fd, executable=executable,
                           priority_lowered=lowered)
        try:
            # Before anyone can reap the child (only its ChildExit will): the pid is ours.
            spawned.pidfd = open_pidfd(popen.pid)
            started_at = proc.process_start_time(popen.pid)
        except BaseException:
            self._discard(spawned)  # nobody would ever supervise it
            raise
        if started_at is not None:
            spawned.started_at = started_at
        # else: already exited (a zombie has no start time to read). Any later liveness
        # check of this identity must say "gone", which the spawn time gives as well as any.
        with self._spawn_lock:
            if not self._spawn_abandoned:
                self._spawned = spawned  # start() claims it once this thread returns
                return spawned
        self._discard(spawned)  # start() was cancelled while we spawned
        return spawned

    def _discard(self, spawned: _Spawned) -> None:
        """Kill a child that start() will never supervise, and reap it in a daemon thread."""
        pid = spawned.popen.pid
        proc.signal_group(pid, signal.SIGKILL)
        self._close_quietly(spawned.stdin_write_fd)
        self._close_quietly(spawned.pidfd)

        def reap() -> None:
            with contextlib.suppress(ChildProcessError):
                spawned.popen.returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            self._remove_temp_dir()

        threading.Thread(target=reap, name=f"reap-{pid}", daemon=True).start()

    def _spawn(self, executable: str, argv: list[str], env: dict[str, str],
               cwd: str) -> tuple[subprocess.Popen[bytes], int | None]:
        """Start the child with stdout/stderr on the spool files; returns it and, when a
        stdin payload is due, the write end of its stdin pipe. Blocking: fork/exec."""
        stdin_payload = self.spec.invocation.stdin
        # O_CLOEXEC: these fds reach this child only (as its 1 and 2), never a sibling run
        # spawned at the same moment.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        opened: list[int] = []
        stdin_write_fd: int | None = None
        try:
            out_fd = os.open(self.stdout_path, flags, 0o600)
            opened.append(out_fd)
            err_fd = os.open(self.stderr_path, flags, 0o600)
            opened.append(err_fd)
            stdin: int = subprocess.DEVNULL
            if stdin_payload is not None:
                stdin, stdin_write_fd = os.pipe2(os.O_CLOEXEC)
                opened.append(stdin)
            process = subprocess.Popen(
                [executable, *argv[1:]], stdin=stdin, stdout=out_fd, stderr=err_fd, cwd=cwd,
                env=env,
                start_new_session=True,  # its own session and process group: pgid == pid
            )
        except FileNotFoundError:
            self._close_quietly(stdin_write_fd)
            if not os.path.isdir(cwd):
                raise GatewayError(ErrorKind.INVALID_INPUT,
                                   f"working_dir {cwd!r} disappeared before the run started."
                                   ) from None
            raise self._not_found(argv[0]) from None
        except OSError as exc:
            self._close_quietly(stdin_write_fd)
            raise GatewayError(
                ErrorKind.LAUNCH_FAILED, f"Failed to launch '{argv[0]}': {exc.strerror or exc}."
            ) from None
        except BaseException:
            self._close_quietly(stdin_write_fd)
            raise
        finally:
            # The child holds its own copies; the gateway keeps none of them open.
            for fd in opened:
                self._close_quietly(fd)
        return process, stdin_write_fd

    def _not_found(self, command: str) -> GatewayError:
        hint = self.spec.install_hint.strip().rstrip(".")
        how = f"Install it ({hint})" if hint else "Install it"
        return GatewayError(
            ErrorKind.NOT_FOUND,
            f"The '{command}' command was not found. {how} and make sure it is on PATH.",
        )

    @staticmethod
    def _close_quietly(fd: int | None) -> None:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _remove_temp_dir(self) -> None:
        # Taken first: the concluding thread and a cancelled supervisor may both get here.
        temp_dir, self._temp_dir = self._temp_dir, None
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)

    async def _feed_stdin(self, fd: int, payload: bytes) -> None:
        """Write the payload into the child's stdin, then close it (the child sees EOF).

        A raw non-blocking pipe instead of asyncio's pipe transport: on Python 3.11 the
        transport makes process.wait() wait until the pipe is closed, so a child (or a
        grandchild) that never reads would also hide the leader's exit from us.
        """
        loop = asyncio.get_running_loop()
        view = memoryview(payload)
        try:
            os.set_blocking(fd, False)
            while view:
                try:
                    written = os.write(fd, view[:STDIN_CHUNK_BYTES])
                    view = view[written:]
                except BlockingIOError:
                    writable = loop.create_future()
                    loop.add_writer(fd, _resolve_once, writable)
                    try:
                        await writable
                    finally:
                        loop.remove_writer(fd)
        except (BrokenPipeError, ConnectionResetError):
            # EPIPE: the child exited or closed stdin before reading everything.
            self._stdin_incomplete = True
        except OSError as exc:
            self._stdin_incomplete = True
            log.warning("writing the provider's stdin failed", action="run_stdin",
                        job_id=self.spec.job_id, error=str(exc))
        finally:
            view.release()
            os.close(fd)

    # -- supervision --------------------------------------------------------------------------

    def _refresh_sizes(self) -> None:
        out = self._size(self.stdout_path)
        err = self._size(self.stderr_path)
        if out != self._stdout_bytes or err != self._stderr_bytes:
            self._last_growth_mono = time.monotonic()
        self._stdout_bytes, self._stderr_bytes = out, err

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return 0

    def _limit_breached(self) -> ErrorKind | None:
        spec = self.spec
        now = time.monotonic()
        if self._stdout_bytes + self._stderr_bytes > spec.max_output_bytes:
            return ErrorKind.OUTPUT_LIMIT
        if now - self._started_mono >= spec.timeout_s:
            return ErrorKind.TIMEOUT
        if spec.idle_timeout_s is not None and now - self._last_growth_mono >= spec.idle_timeout_s:
            return ErrorKind.IDLE_TIMEOUT
        return None

    async def _supervise(self, child: ChildExit) -> RunOutcome:
        assert self._identity is not None
        pgid = self._identity.pgid
        job_id = self.spec.job_id
        leader_exit = child.exited
        stop_requested = asyncio.create_task(self._stop_requested.wait(),
                                             name=f"run-stop-requested:{job_id}")
        wakers: set[asyncio.Future[Any]] = {leader_exit, stop_requested}
        try:
            while not leader_exit.done() and self._stop is None:
                await asyncio.wait(wakers, timeout=MONITOR_INTERVAL_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                self._refresh_sizes()
                if self._priority_pending:  # rate-limited by the kernel: retried each tick
                    self._priority_pending = not proc.lower_priority(pgid, PROVIDER_NICE_INCREMENT)
                if self._stop is None and not leader_exit.done():
                    breach = self._limit_breached()
                    if breach is not None:
                        self.cancel(breach)
                    elif spool.filesystem_full(self.spec.spool_dir):
                        # The provider's writes fail (ENOSPC) and a CLI may carry on anyway:
                        # the run ends now, with the output written so far.
                        self.cancel(ErrorKind.OUTPUT_LIMIT, FULL_DISK_STOP_MESSAGE.format(
                            spool=self.spec.spool_dir))
            # A stop asked for before we saw the leader exit decides the outcome.
            stop = self._stop
            strays = 0
            if stop is not None:
                await self._stop_group(pgid, leader_exit, stop.grace_s)
            else:
                strays = len(proc.group_members(pgid))
                if strays:
                    # The leader is done but left processes in its group: stop them the same
                    # way, so that nothing leaks past the run.
                    log.info("stopping processes left behind by the provider",
                             action="run_strays", job_id=self.spec.job_id, count=strays)
                    await self._stop_group(pgid, leader_exit, self.spec.kill_grace_s)
            returncode = await leader_exit
            if self._stdin_task is not None and not self._stdin_task.done():
                # The whole group is gone, so nobody can read the rest of the payload.
                self._stdin_incomplete = True
                self._stdin_task.cancel()
                await asyncio.wait({self._stdin_task})
            # Off the loop: the last stat()s, cutting the spool files to the cap, reading the
            # stderr tail and removing the temp cwd block for milliseconds.
            outcome = await asyncio.to_thread(self._conclude, stop, returncode, strays)
            log.info("provider process finished", action="run_end", job_id=self.spec.job_id,
                     exit_code=outcome.exit_code, error_kind=outcome.error_kind,
                     duration_s=round(outcome.duration_s, 3))
            return outcome
        except asyncio.CancelledError:
            # Not a gateway crash: the gateway lives on, so the group must not outlive us.
            if not (leader_exit.done() and not proc.group_alive(pgid)):
                proc.signal_group(pgid, signal.SIGKILL)
            # The loop may be closing (asyncio.run's teardown): a thread reaps the leader.
            child.reap_in_background()
            if self._stdin_task is not None:
                self._stdin_task.cancel()
            raise
        finally:
            stop_requested.cancel()
            self._finished = True
            self._remove_temp_dir()  # a no-op unless the run was cancelled before _conclude

    async def _stop_group(self, pgid: int, leader_exit: asyncio.Future[int],
                          grace_s: float) -> None:
        """SIGTERM the group; SIGKILL it after the grace unless every member is gone by then.

        The SIGKILL goes to the group even when the leader has already exited: grandchildren
        that ignore SIGTERM would otherwise live on. Returns once the leader is reaped (its
        ChildExit does that) and no member runs any more.
        """

        def group_gone() -> bool:
            # While the leader runs (or is a zombie not yet reaped) the pgid cannot be reused,
            # so signalling it can only reach this run's processes.
            return leader_exit.done() and not proc.group_alive(pgid)

        if group_gone():
            return
        proc.signal_group(pgid, signal.SIGTERM)
        self._kill_at = time.monotonic() + grace_s
        if await self._group_gone_by(group_gone, lambda: self._kill_at or 0.0, leader_exit):
            return
        proc.signal_group(pgid, signal.SIGKILL)
        log.info("process group killed after its grace", action="run_kill",
                 job_id=self.spec.job_id, pgid=pgid)
        await leader_exit  # SIGKILL cannot be ignored: the leader will exit
        reap_deadline = time.monotonic() + REAP_TIMEOUT_S
        if not await self._group_gone_by(group_gone, lambda: reap_deadline, leader_exit):
            log.warning("process group members survive SIGKILL", action="run_kill",
                        job_id=self.spec.job_id, pgid=pgid, members=proc.group_members(pgid))

    async def _group_gone_by(self, group_gone: Callable[[], bool], deadline: Callable[[], float],
                             leader_exit: asyncio.Future[int]) -> bool:
        """Poll until the group is gone (True) or the deadline passes (False). The deadline
        is re-read each round: a shutdown may shorten a cancel's grace."""
        while not group_gone():
            remaining = deadline() - time.monotonic()
            if remaining <= 0:
                return False
            # Wakes at once on the leader's exit; later members are polled for.
            await asyncio.wait({leader_exit}, timeout=min(GROUP_POLL_INTERVAL_S, remaining))
            self._refresh_sizes()
        return True

    def _truncate_to_cap(self) -> bool:
        """Cut the spool files to max_output_bytes in total (stdout first: it carries the
        answer). Runs only after the group is gone, so no writer can extend them again."""
        cap = self.spec.max_output_bytes
        out, err = self._stdout_bytes, self._stderr_bytes
        if out + err <= cap:
            return False
        keep_out = min(out, cap)
        keep_err = min(err, cap - keep_out)
        for path, size, keep in ((self.stdout_path, out, keep_out),
                                 (self.stderr_path, err, keep_err)):
            if size > keep:
                os.truncate(path, keep)
        self._stdout_bytes, self._stderr_bytes = keep_out, keep_err
        return True

    def _conclude(self, stop: _StopRequest | None, returncode: int, strays: int) -> RunOutcome:
        """The outcome, once the group is gone (blocking file work: runs in a thread)."""
        self._refresh_sizes()
        outcome = self._outcome(stop, returncode, strays)
        self._remove_temp_dir()
        return outcome

    def _outcome(self, stop: _StopRequest | None, returncode: int, strays: int) -> RunOutcome:
        written = self._stdout_bytes + self._stderr_bytes
        truncated = self._truncate_to_cap()
        extra: dict[str, object] = {"provider_exit_code": returncode}
        if strays:
            extra["stray_processes"] = strays
        if truncated:
            extra["bytes_written"] = written
        died_of = -returncode if returncode < 0 else None
        kind: ErrorKind | None
        exit_code: int | None
        error: str | None
        if stop is not None:
            kind, error = stop.kind, stop.message
            exit_code = EXIT_CODES.get(kind)  # 124/125/126; None for cancel and shutdown
        elif truncated:
            kind, error = ErrorKind.OUTPUT_LIMIT, _default_stop_message(
                ErrorKind.OUTPUT_LIMIT, self.spec)
            exit_code = EXIT_CODES[kind]
        elif died_of is not None:
            kind = ErrorKind.PROVIDER_ERROR
            exit_code = 128 + died_of  # the shell's convention for "killed by signal N"
            error = f"The provider was killed by {proc.signal_name(died_of)} (not by the gateway)."
            tail = self._stderr_tail()
            error = f"{error}\n{tail}" if tail else error
        elif returncode == 0 and self._stdin_incomplete:
            kind, exit_code = ErrorKind.LAUNCH_FAILED, EXIT_CODES[ErrorKind.LAUNCH_FAILED]
            error = "The provider closed stdin before the whole request was delivered."
            extra["stdin_incomplete"] = True
        elif returncode == 0:
            kind, exit_code, error = None, 0, None
        else:
            kind, exit_code = ErrorKind.PROVIDER_ERROR, returncode
            error = self._stderr_tail() or (
                f"The provider exited with code {returncode} and wrote nothing to stderr.")
        return RunOutcome(
            exit_code=exit_code, error_kind=kind, error=error,
            stdout_path=self.stdout_path, stderr_path=self.stderr_path,
            stdout_bytes=self._stdout_bytes, stderr_bytes=self._stderr_bytes,
            truncated=truncated, duration_s=time.monotonic() - self._started_mono,
            signal=died_of, extra=extra,
        )

    def _stderr_tail(self) -> str:
        return _last_lines(spool.read_tail(self.stderr_path, ERROR_TAIL_BYTES), ERROR_TAIL_LINES)
