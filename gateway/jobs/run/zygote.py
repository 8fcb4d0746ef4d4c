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
  supervisor has exited and been reaped here. The exit line is how the gateway learns a
  run's end at once, on every platform: the supervisor is the zygote's child, not its own.

Stdlib only, and imported as a top-level module (`python -I -S`, no site-packages, no
gateway package), like the supervisor. Single-threaded: fork() in a process with threads
would copy their locks in whatever state they are. It holds no directory of anyone's (cwd
`/`), starts with an empty environment, and is non-dumpable where the platform can make it
so: every run's environment passes through its memory. Its stdin at EOF (the gateway exited,
or was SIGKILLed) ends it; the supervisors it forked run on.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import traceback

# Imported as gateway.jobs.run.zygote by the gateway's tests and type checker, as a top-level
# module (with the supervisor and posix_detach beside it on sys.path) by the zygote.
try:
    from gateway.jobs.run import supervisor
    from gateway.platform import posix_detach
except ImportError:  # no gateway package: the zygote's isolated interpreter
    import posix_detach  # type: ignore[import-not-found,no-redef]
    import supervisor  # type: ignore[import-not-found,no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

READ_CHUNK_BYTES = 65536


def _send(message: dict[str, Any]) -> None:
    """One line to the gateway. Blocking: the gateway's reader thread always reads."""
    data = (json.dumps(message) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _reap() -> None:
    """Collect every forked supervisor that has exited, and tell the gateway."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})


def _fork(request: dict[str, Any], closing: list[int]) -> None:
    """Fork the run's supervisor; in the child, supervise the run and leave with its code."""
    try:
        pid = posix_detach.fork_session()
    except OSError as exc:
        _send({"id": request.get("id"), "error": exc.strerror or str(exc)})
        return
    if pid != 0:
        _send({"id": request.get("id"), "pid": pid})
        return
    code = 2
    try:  # the supervisor: nothing of the zygote's stays with it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        code = supervisor.take_run(request)
    except BaseException:  # the log is all that is left to tell
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


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
    pending = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_read], [], [])
        except InterruptedError:  # pragma: no cover - PEP 475 retries select() itself
            continue
        if wake_read in readable:
            os.read(wake_read, READ_CHUNK_BYTES)
            _reap()
        if 0 not in readable:
            continue
        chunk = os.read(0, READ_CHUNK_BYTES)
        if not chunk:
            return 0  # the gateway is gone: what was forked runs on
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                _fork(json.loads(line), [0, 1, wake_read, wake_write])
        _reap()  # a burst of forks: report exits without waiting for the next wake


def main(argv: list[str]) -> int:
    """`zygote <platform>`: serve until stdin closes (the gateway starts it: forks.py)."""
    if len(argv) != 2:
        sys.stderr.write("usage: zygote PLATFORM (the gateway starts it)\n")
        return 2
    try:
        return serve(argv[1])
    except BrokenPipeError:
        return 0  # the gateway stopped reading: it is gone
