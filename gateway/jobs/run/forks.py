"""The gateway's end of its zygote (zygote.py): start it, ask it for a run's supervisor, learn
each forked supervisor's exit.

One zygote per gateway process, started at its first run (an interpreter start, what every
run used to pay) and again after it died: `await Zygote.fork()` sends the run and waits for
the forked supervisor's pid. All of it happens on the event loop, with no thread: requests
are written without blocking, and the loop reads the zygote's lines: the pid a request
waits for, and each supervisor's exit, which resolves that run's `ForkedExit`.

What is not lost when something dies:
- the gateway: the zygote reads EOF and exits; the supervisors run on and are adopted;
- the zygote: its supervisors run on (re-parented); their exits are no longer reported, so
  each `ForkedExit` of a run it forked falls back to polling its pid (`EXIT_POLL_S`), and the
  next run starts a new zygote. A request it took and never answered (it died, or it stopped
  answering: SIGSTOP, and was killed) may or may not have forked: `ForkUnanswered`; the
  runner sends the same launch to the new zygote, and the run's one claim decides which
  supervisor runs it (runner.py), never a second launch;
- a supervisor: its exit line comes like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gateway import platform, proc
from gateway.jobs.run import zygote as zygote_program
from gateway.model import ErrorKind, GatewayError

log = structlog.get_logger(__name__)

RUN_DIR = Path(zygote_program.__file__).resolve().parent
# The zygote imported as a module (from its own directory, after the stdlib), not run as a
# script: an imported module's bytecode is cached, a script is compiled at every start. Its
# arguments: the platform implementation (gateway/platform) and the folders to import it
# from. It ends with os._exit: the interpreter's teardown has nothing to save.
ZYGOTE_BOOT = (f"import os, sys; sys.path.append({str(RUN_DIR)!r}); "
               "sys.path.extend(sys.argv[2:]); import zygote; "
               "code = zygote.main(sys.argv[:2]); sys.stderr.flush(); os._exit(code)")
# How long a run waits for the zygote to answer its fork. A fork and a line take about a
# millisecond; only a zygote that is stopped (SIGSTOP) or starved for this long misses it.
FORK_ANSWER_TIMEOUT_S = 10.0
# How often a run whose zygote died checks that its supervisor still lives.
EXIT_POLL_S = 0.02
# A supervisor gone (or a zombie) this long with no exit line from its zygote: the zygote is
# stopped (SIGSTOP) or starved, and the run's end is taken from the process table instead.
EXIT_REPORT_GRACE_S = 2.0
EXIT_PROBE_S = 0.5  # how often a watcher reads the process table for that

ExitCallback = Callable[[int | None], None]  # a returncode, or None: the zygote is gone


class ForkUnanswered(Exception):
    """The zygote took the run and never said whether it forked (it died or stopped
    answering): a supervisor may be running it. The run's claim tells."""


class Link:
    """One zygote process, written to and read on the event loop that started it.

    Its lines are read by the loop itself (add_reader) and requests written by it (add_writer
    for what the pipe does not take at once), not by threads that then wake the loop: a
    fork's answer and a supervisor's exit each resolve their future in the loop step that
    reads them, thread wakes less on the path of every run (bench/README.md, the cost rows).
    A link serves one loop: a gateway has one for its life; a new loop (tests run many) gets
    a new zygote (`Zygote._current`). Create it on that loop: starting the zygote blocks the
    loop for its fork and exec, about a millisecond, once per gateway."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        chosen = platform.supervisor_spec()
        # -I: no PYTHON* variables, no user site, no script dir on sys.path; -S: no site
        # import. The zygote and its supervisors need the stdlib only.
        self.popen = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", ZYGOTE_BOOT, str(chosen["platform"]),
             *chosen["platform_path"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            cwd="/", env={},  # holds no directory and no secret of anyone's
            **platform.current().detach_kwargs(),  # a session of its own: no terminal signal
        )
        self.loop = loop
        # Guards what another loop's thread may touch (abandon(), has_exited(), watch()).
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[int]] = {}
        self._statuses: dict[int, int] = {}  # exits that no watcher has taken yet
        self._watchers: dict[int, ExitCallback] = {}
        self._pending = b""
        # Request bytes the pipe did not take yet (a burst of large environments while the
        # zygote forks): written in order when it can take more. Never a partial line lost.
        self._outbox = bytearray()
        self._writing = False
        self._reaping = False
        self.alive = True
        assert self.popen.stdout is not None and self.popen.stdin is not None
        self._out = self.popen.stdout.fileno()
        self._in = self.popen.stdin.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        loop.add_reader(self._out, self._read)
        self._reading = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    async def fork(self, run: dict[str, Any]) -> int:
        """The pid of the supervisor forked for `run` (on the link's loop). Raises OSError
        when the request could not be sent (the zygote is gone: nothing was forked),
        ForkUnanswered when it was sent and not answered, GatewayError when fork() failed
        in the zygote. Cancelled while it waits, the answer is not awaited any more: the
        caller cannot know whether a supervisor was forked (runner.py handles that)."""
        answer: asyncio.Future[int] = self.loop.create_future()
        with self._lock:
            if not self.alive:
                raise BrokenPipeError("the zygote is gone")
            request_id = next(self._ids)
            self._answers[request_id] = answer
        try:
            self._send((json.dumps({"id": request_id, **run}) + "\n").encode("utf-8"))
        except OSError as exc:
            with self._lock:
                self._answers.pop(request_id, None)
            self.alive = False  # the next run starts a new one (its EOF may come later)
            raise BrokenPipeError(f"the zygote is gone: {exc}") from None
        try:
            async with asyncio.timeout(FORK_ANSWER_TIMEOUT_S):
                return await answer
        except TimeoutError:
            log.warning("the zygote did not answer a fork; replacing it", action="zygote",
                        zygote_pid=self.pid, timeout_s=FORK_ANSWER_TIMEOUT_S)
            self.kill()
            raise ForkUnanswered from None

    def _send(self, data: bytes) -> None:
        """Queue whole request lines in order (on the loop, one step: two requests' bytes
        never interleave) without ever blocking it. Raises OSError: the zygote is gone."""
        if self.popen.stdin is None or self.popen.stdin.closed:
            raise BrokenPipeError("its stdin is closed")
        if not self._outbox:
            with contextlib.suppress(BlockingIOError):
                data = data[os.write(self._in, data):]
        if data:
            self._outbox += data
            if not self._writing:
                self.loop.add_writer(self._in, self._flush)
                self._writing = True

    def _flush(self) -> None:
        """The loop's writer: the pipe takes more."""
        try:
            del self._outbox[:os.write(self._in, self._outbox)]
        except BlockingIOError:
            return
        except OSError:  # EPIPE: it died; its EOF tells every request that waits
            self._outbox.clear()
            self.alive = False
        if not self._outbox:
            self._stop_writing()

    def _stop_writing(self) -> None:
        if self._writing:
            self._writing = False
            self._outbox.clear()
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.remove_writer(self._in)

    def watch(self, pid: int, callback: ExitCallback) -> None:
        """Call `callback` (on the link's loop, or at once) with `pid`'s returncode once
        the zygote reaped it, or with None if the zygote went first."""
        with self._lock:
            status = self._statuses.pop(pid, None)
            if status is None and self.alive:
                self._watchers[pid] = callback
                return
        callback(status)

    def has_exited(self, pid: int) -> bool:
        """Whether the zygote reported `pid`'s exit (not taken by a watcher yet)."""
        with self._lock:
            return pid in self._statuses

    def close(self) -> None:
        """The gateway stops: the zygote reads EOF and exits (its supervisors run on).
        Requests not written yet are dropped: their runs hear ForkUnanswered at the EOF."""
        with self._lock:
            self._stop_writing()  # before the descriptor can be closed and its number reused
            with contextlib.suppress(OSError):
                assert self.popen.stdin is not None
                self.popen.stdin.close()

    def kill(self) -> None:
        """Replace it: from now on runs start a new zygote (its EOF, which tells its
        watchers, comes once it is dead)."""
        self.alive = False
        with contextlib.suppress(OSError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # its own group: the supervisors are not in it
        self.close()

    def _read(self) -> None:
        """The loop's reader: every whole line the zygote wrote, then its EOF."""
        try:
            chunk = os.read(self._out, zygote_program.READ_CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._gone()
            return
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        if "exited" in message:
            pid, status = int(message["exited"]), int(message["status"])
            with self._lock:
                callback = self._watchers.pop(pid, None)
                if callback is None:
                    self._statuses[pid] = status
            if callback is not None:
                callback(status)
            return
        with self._lock:
            answer = self._answers.pop(int(message.get("id") or 0), None)
        if answer is None or answer.done():
            return  # answered after its request timed out: the claim settles that run
        if "pid" in message:
            answer.set_result(int(message["pid"]))
        else:
            answer.set_exception(GatewayError(
                ErrorKind.LAUNCH_FAILED,
                f"Failed to start the run's supervisor: {message.get('error')}."))

    def _gone(self) -> None:
        """EOF: the zygote exited (or was killed). Everything waiting on it is told."""
        with self._lock:
            self.alive = False
            answers, self._answers = self._answers, {}
            watchers, self._watchers = self._watchers, {}
        for answer in answers.values():
            if not answer.done():
                with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                    answer.set_exception(ForkUnanswered())
        for callback in watchers.values():
            callback(None)
        self.close()
        self._stop_reading()
        self._reap_later()

    def _stop_reading(self) -> None:
        """On the link's loop, or once that is closed."""
        if self._reading:
            self._reading = False
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.remove_reader(self._out)
        assert self.popen.stdout is not None
        self.popen.stdout.close()

    def abandon(self) -> None:
        """The gateway stops, or the link's loop is gone (a new one runs the runs now): EOF
        to the zygote, which exits, reaped here; the runs it forked go on (their exits are
        reported no more: what waited for them is drained, or on a loop that is gone)."""
        self.alive = False
        self.close()
        try:
            here = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            here = False
        # Not read any more: the zygote's next write fails (EPIPE), it says nothing more,
        # settles and exits at its EOF (zygote.py); whatever still waits on it is told.
        if here or self.loop.is_closed():
            self._gone()
            return
        try:
            self.loop.call_soon_threadsafe(self._gone)
        except RuntimeError:  # closed meanwhile
            self._gone()

    def _reap_later(self) -> None:
        """It exits right after EOF: reaped by a thread, so that no loop waits (once)."""
        with self._lock:
            if self._reaping:
                return
            self._reaping = True

        def reap() -> None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)

        threading.Thread(target=reap, name=f"zygote-reap-{self.pid}", daemon=True).start()


class Zygote:
    """This gateway process's zygote, used from the event loop of its runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._link: Link | None = None
        # How a supervisor starts this gateway's finalizer (finalizer.handoff), set by the
        # gateway at start; None: no finalizer (an in-memory store, or not started yet).
        self.finalizer: dict[str, Any] | None = None

    @property
    def pid(self) -> int | None:
        """The zygote's pid while one lives (gateway_status, the bench, tests)."""
        link = self._link
        return link.pid if link is not None and link.alive else None

    async def fork(self, spool_dir: Path, token: str, env: dict[str, str]
                   ) -> tuple[int, Link]:
        """Fork a supervisor for the run in `spool_dir`: its pid, and the link that reports
        its exit on the running loop. The run's environment (and the finalizer's settings:
        the store's DSN may be in them) go through the pipe, never a file. Raises
        ForkUnanswered (see above) or GatewayError(LAUNCH_FAILED)."""
        run = {"spool_dir": str(spool_dir), "token": token, "env": env,
               "finalizer": self.finalizer}
        loop = asyncio.get_running_loop()
        failure: OSError | None = None
        for _ in range(2):  # a zygote that died idle: once more, with a new one
            try:
                link = self._current(loop)
                return await link.fork(run), link
            except OSError as exc:
                failure = exc
        raise GatewayError(ErrorKind.LAUNCH_FAILED, "Failed to start the run's supervisor: "
                           f"{(failure and failure.strerror) or failure}.")

    def close(self) -> None:
        """The gateway stops: its zygote exits once it reads EOF."""
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.abandon()

    def _current(self, loop: asyncio.AbstractEventLoop) -> Link:
        with self._lock:
            if self._link is not None and self._link.loop is not loop:
                self._link.abandon()
            if self._link is None or not self._link.alive:
                self._link = Link(loop)  # raises OSError (EAGAIN, ENOMEM)
            return self._link


class ForkedExit:
    """The exit of a supervisor our zygote forked: `exited` resolves with its returncode once
    the zygote reaped it, or, if the zygote died first, with None once the process is gone
    (init reaps it then). Create it on the event loop.

    Between the zygote's reap and this future's resolution the pid is free for reuse; a
    signal sent to it in that window (a stop) could only reach another process if the pid
    space wrapped around within it."""

    def __init__(self, link: Link | None, pid: int, started_at: float) -> None:
        self.pid = pid
        self._started_at = started_at
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int | None] = self._loop.create_future()
        self._poller: asyncio.Task[None] | None = None
        self._gone_since: float | None = None
        self._next_probe = self._loop.time() + EXIT_PROBE_S
        if link is None:  # forked by a zygote that is gone
            self._resolve(None)
        else:
            link.watch(pid, self._from_reader)

    def check(self) -> None:
        """Called on the watcher's tick: a supervisor that is gone while its zygote says
        nothing (stopped) ends the wait after EXIT_REPORT_GRACE_S, its status unknown. The
        process table is read at most every EXIT_PROBE_S (a run's watcher ticks ten times
        a second; a burst of runs made these reads a noticeable part of each run's CPU)."""
        if self.exited.done():
            return
        now = self._loop.time()
        if now < self._next_probe:
            return
        self._next_probe = now + EXIT_PROBE_S
        if proc.is_process_alive(self.pid, self._started_at):
            self._gone_since = None
            return
        if self._gone_since is None:
            self._gone_since = now
        elif now - self._gone_since >= EXIT_REPORT_GRACE_S:
            log.warning("a run's supervisor exited and its zygote did not report it; going "
                        "by the process table", action="zygote", pid=self.pid)
            self.exited.set_result(None)

    def _from_reader(self, status: int | None) -> None:
        """The link's report: on this loop (its reader, or watch() called here), else from
        a link of another loop's (gone: None)."""
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._resolve(status)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._resolve, status)

    def _resolve(self, status: int | None) -> None:
        if self.exited.done():
            return
        if status is not None:
            self.exited.set_result(status)
        elif self._poller is None:
            self._poller = self._loop.create_task(self._poll(), name=f"exit-poll-{self.pid}")

    async def _poll(self) -> None:
        while proc.is_process_alive(self.pid, self._started_at):
            await asyncio.sleep(EXIT_POLL_S)
        if not self.exited.done():
            self.exited.set_result(None)
