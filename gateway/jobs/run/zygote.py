"""The zygote: one small process per gateway that forks a run's supervisor on request (issue 26).

Every run is supervised (docs/architecture.md, Running a provider), and a supervisor used to
be an interpreter of its own: about 35 ms of CPU per run, paid by every run of a burst, so
the drain rate fell below the admission rate. The zygote is that interpreter started once,
with the supervisor and the platform implementation imported; a run then costs a fork() and
a line on a pipe. Each forked supervisor leaves the zygote's session before it does anything
(`posix_detach.fork_session`), so it leads a session and process group of its own (pgid ==
pid), exactly as a supervisor started alone did; it survives the zygote and the gateway.

The protocol (gateway side: gateway/jobs/run/forks.py), JSON lines:
- gateway -> zygote, stdin: `{"id", "spool_dir", "token", "env", "finalizer"}`, one run each;
- zygote -> gateway, stdout: `{"id", "pid"}` once the run's supervisor is forked (`{"id",
  "error"}` when fork() failed), and `{"exited": pid, "status": returncode}` once a forked
  supervisor of a run has exited and been reaped here (a spare that never got a run, see
  `Spare`, is reaped without a word). The exit line is how the gateway learns a
  run's end at once, on every platform: the supervisor is the zygote's child, not its own.

Stdlib only, and imported as a top-level module (`python -I -S`, no site-packages, no
gateway package), like the supervisor. Single-threaded: fork() in a process with threads
would copy their locks in whatever state they are. It holds no directory of anyone's (cwd
`/`), starts with an empty environment, and is non-dumpable where the platform can make it
so: every run's environment passes through its memory. Its stdin at EOF (the gateway exited,
or was SIGKILLed) ends it; the supervisors it forked run on. Before it goes it starts its
gateway's finalizer for every run that ended and was not finalized: a supervisor whose
zygote lives leaves that to the zygote (handoff.start_finalizer_if_alone) instead of
watching its gateway from a process of its own.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys
import time
import traceback

# Imported as gateway.jobs.run.zygote by the gateway's tests and type checker, as a top-level
# module (with the supervisor and posix_detach beside it on sys.path) by the zygote.
try:
    from gateway.jobs.run import handoff, supervisor
    from gateway.platform import posix_detach
except ImportError:  # no gateway package: the zygote's isolated interpreter
    import handoff  # type: ignore[import-not-found,no-redef]
    import posix_detach  # type: ignore[import-not-found,no-redef]
    import supervisor  # type: ignore[import-not-found,no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

READ_CHUNK_BYTES = 65536
# Past this many runs whose finalizing may still be owed, the ones already finalized (no end
# record any more: their gateway removed the spool) are forgotten.
OWED_PRUNE_AT = 64
# On EOF: how long to wait for a supervisor that has recorded its run's end to exit.
EXITING_WAIT_S = 2.0
# How long the zygote is idle before it forks a spare supervisor (Spare): past the start of
# the run it just forked, which it would otherwise compete with for the CPU.
SPARE_AFTER_S = 0.01


def _send(message: dict[str, Any]) -> None:
    """One line to the gateway. Blocking: the gateway's event loop reads it at once."""
    data = (json.dumps(message) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


class Runs:
    """The runs this zygote forked: live ones, and ended ones whose terminal row its
    gateway may still owe (their supervisors left the finalizer to this zygote)."""

    def __init__(self) -> None:
        self.live: dict[int, dict[str, Any]] = {}  # pid -> its spool dir and finalizer
        self.owed: list[dict[str, Any]] = []
        # The gateway no longer reads (EPIPE): what is left is its stdin's EOF, and settling.
        self.unheard = False

    def reap(self) -> None:
        """Collect every forked supervisor that has exited, and tell the gateway."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.live:
                continue  # a spare that never got a run: there is nothing to tell
            self._ended(pid)
            self.tell({"exited": pid, "status": os.waitstatus_to_exitcode(status)})

    def tell(self, message: dict[str, Any]) -> None:
        """A line to the gateway while it reads. Once it stopped (EPIPE: it is gone, or it
        closed us and its EOF follows), nothing more is said: the zygote still settles."""
        if self.unheard:
            return
        try:
            _send(message)
        except BrokenPipeError:
            self.unheard = True

    def _ended(self, pid: int) -> None:
        request = self.live.pop(pid, None)
        if request is None or not request.get("finalizer"):
            return
        self.owed.append(request)
        if len(self.owed) > OWED_PRUNE_AT:
            self.owed = [r for r in self.owed if _end_recorded(r)]

    def settle(self, platform: Any) -> None:
        """The gateway is gone (EOF): start its finalizer for every run that ended and is
        not finalized, once its supervisor is gone. Runs still going start it themselves
        at their end (they will find the gateway gone)."""
        deadline = time.monotonic() + EXITING_WAIT_S
        while any(_end_recorded(r) for r in self.live.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
            self.reap_quietly()
        for request in self.owed:
            handoff.start_finalizer(str(request["spool_dir"]), request["finalizer"],
                                       platform)

    def reap_quietly(self) -> None:
        """reap() with nobody left to tell."""
        self.unheard = True
        with contextlib.suppress(OSError):
            self.reap()


def _end_recorded(request: dict[str, Any]) -> bool:
    return os.path.exists(os.path.join(str(request["spool_dir"]), supervisor.END_NAME))


def _fork(request: dict[str, Any], runs: Runs, fds: ForkContext) -> None:
    """Fork the run's supervisor; in the child, supervise the run and leave with its code."""
    zygote_pid = os.getpid()
    try:
        pid = posix_detach.fork_session()
    except OSError as exc:
        runs.tell({"id": request.get("id"), "error": exc.strerror or str(exc)})
        return
    if pid != 0:
        _started(pid, request, runs)
        return
    _supervise(lambda: request, zygote_pid, fds)


def _started(pid: int, request: dict[str, Any], runs: Runs) -> None:
    # What settling needs, not the run's environment: nothing of it outlives the fork.
    runs.live[pid] = {"spool_dir": request.get("spool_dir"),
                      "finalizer": request.get("finalizer")}
    runs.tell({"id": request.get("id"), "pid": pid})


class Spare:
    """A supervisor forked ahead of its run, waiting for it on a pipe of its own.

    fork() and the child's setsid() take a millisecond or two on a busy box, and an isolated
    run (a sync request, the first of a burst) waited for them. The spare pays them while
    the zygote is idle (SPARE_AFTER_S after its last request); a run then costs one write.
    It holds nothing of anyone's until its run comes (cwd `/`, the zygote's empty
    environment), and leaves at once when the pipe reads EOF unused: the zygote is closing
    or gone. A burst's other runs are forked as before, and the spare is made again after."""

    def __init__(self, pid: int, pipe: int) -> None:
        self.pid = pid
        self.pipe = pipe  # the write end: the run's request, then EOF

    @classmethod
    def fork(cls, fds: ForkContext) -> Spare | None:
        zygote_pid = os.getpid()
        read_end, write_end = os.pipe()
        try:
            pid = posix_detach.fork_session()
        except OSError:  # no spare now (EAGAIN, ENOMEM): a run is forked when it comes
            os.close(read_end)
            os.close(write_end)
            return None
        if pid != 0:
            os.close(read_end)
            return cls(pid, write_end)
        os.close(write_end)
        _supervise(lambda: _read_request(read_end), zygote_pid, fds)

    def take(self, line: bytes, request: dict[str, Any], runs: Runs) -> bool:
        """Hand the spare its run; False when it is gone (killed meanwhile): fork one."""
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self.pipe, view):]
        except OSError:  # EPIPE: it died unused (it is reaped like any child)
            return False
        finally:
            self.close()
        _started(self.pid, request, runs)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pipe)


def _read_request(fd: int) -> dict[str, Any] | None:
    """A spare's run, or None at EOF with nothing read (the zygote closed it unused)."""
    chunks = []
    while True:
        chunk = os.read(fd, READ_CHUNK_BYTES)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    data = b"".join(chunks)
    return json.loads(data) if data.strip() else None


def _supervise(request: Callable[[], dict[str, Any] | None], zygote_pid: int,
               fds: ForkContext) -> NoReturn:
    """In a forked child: become the supervisor of `request()`'s run and leave with its code
    (os._exit: the child shares the zygote's buffers). None: leave with nothing to do."""
    code = 2
    try:  # the supervisor: nothing of the zygote's stays with it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in fds.closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)  # 0: the lowest free one
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        if devnull > 1:
            os.close(devnull)
        # Before the run comes: a spare pays for it while it waits (0.3 ms, 0.5 with
        # psutil), not the run's path. The claim names the supervisor by it.
        started_at = fds.platform.own_start_time()
        run = request()
        code = 0 if run is None else handoff.take_run(run, fds.platform, zygote_pid, started_at)
    except BaseException:  # the log is all that is left to tell
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkContext:
    """What a forked supervisor takes from the zygote: `closing`, the zygote's descriptors,
    which it closes at once; `platform`, the implementation the zygote imported."""

    def __init__(self, closing: list[int], platform: Any) -> None:
        self.closing = closing
        self.platform = platform


def serve(platform_name: str) -> int:
    """The zygote's loop, until its gateway closes stdin."""
    platform = __import__(platform_name)
    platform.make_non_dumpable()
    for ignored in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(ignored, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select() via the fd
    # Everything imported so far lives as long as the zygote: frozen, no collection in a
    # forked supervisor walks (and so copies) the pages it shares with the zygote.
    gc.freeze()
    runs = Runs()
    spare: Spare | None = None
    fds = ForkContext([0, 1, wake_read, wake_write], platform)  # a forked supervisor's
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_read], [], [],
                                           None if spare else SPARE_AFTER_S)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select() itself
            continue
        if not readable:  # idle: the next run's supervisor is forked ahead of it
            spare = Spare.fork(fds)
            continue
        if wake_read in readable:
            os.read(wake_read, READ_CHUNK_BYTES)
            runs.reap()
        if 0 not in readable:
            continue
        chunk = os.read(0, READ_CHUNK_BYTES)
        if not chunk:  # the gateway is gone: what was forked runs on
            if spare is not None:
                spare.close()  # it reads EOF and leaves
            runs.reap_quietly()
            runs.settle(platform)
            return 0
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            request = json.loads(line)
            taken = spare is not None and spare.take(line, request, runs)
            spare = None  # it took the run, or it was gone unused
            if not taken:
                _fork(request, runs, fds)
        runs.reap()  # a burst of forks: report exits without waiting for the next wake


def main(argv: list[str]) -> int:
    """`zygote <platform>`: serve until stdin closes (the gateway starts it: forks.py)."""
    if len(argv) != 2:
        sys.stderr.write("usage: zygote PLATFORM (the gateway starts it)\n")
        return 2
    try:
        return serve(argv[1])
    except BrokenPipeError:
        return 0  # the gateway stopped reading: it is gone
