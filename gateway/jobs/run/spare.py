"""One supervisor started ahead of need (every run is supervised: docs/architecture.md, Running a provider).

A run's supervisor is an interpreter of its own, and every run used to wait for one to start
(about 35 ms on a 2-core box, the largest part of bench/'s sync_overhead). So each gateway
process keeps one started supervisor waiting on its stdin: a run hands it over (spool dir,
launch token and the CLI's environment, one JSON document), and the next spare starts while
that run's CLI works. The first run of a process starts its supervisor the old way.

A spare holds nothing of anyone's: it starts in `/` with an empty environment (the run's
environment arrives with the run, through the pipe, never through a file), and when its
gateway goes (exit, SIGKILL) its stdin reaches EOF and it exits without doing anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gateway import platform, proc
from gateway.jobs.run import supervisor as sup

SUPERVISOR_PATH = Path(sup.__file__).resolve()
# The supervisor imported as a module (from its own directory, after the stdlib), not run as
# a script: an imported module's bytecode is cached, a script is compiled at every start
# (about 20 ms). Its arguments: the platform implementation (gateway/platform) and the
# folders to import it from, imported ahead of its run (portable: psutil, tens of ms). Then
# it waits for its run on stdin (supervisor.main with no arguments). It ends with os._exit:
# its records are written and fsynced by then, and the interpreter's teardown would only
# delay the moment its gateway sees the run end.
SUPERVISOR_BOOT = (f"import os, sys; sys.path.append({str(SUPERVISOR_PATH.parent)!r}); "
                   "sys.path.extend(sys.argv[2:]); __import__(sys.argv[1]); "
                   "import supervisor; code = supervisor.main(sys.argv[:1]); "
                   "sys.stderr.flush(); os._exit(code)")


class Spares:
    """The spare of this process. Thread-safe: runs are spawned from worker threads."""

    def __init__(self, nice_increment: int) -> None:
        self._nice_increment = nice_increment
        self._lock = threading.Lock()
        self._spare: subprocess.Popen[bytes] | None = None
        # How a supervisor starts this gateway's finalizer (finalizer.handoff), set by the
        # gateway at start; None: no finalizer (an in-memory store, or not started yet).
        self.finalizer: dict[str, Any] | None = None

    def take(self) -> subprocess.Popen[bytes]:
        """The spare if it is alive, else a supervisor started now. Raises OSError."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            if spare.poll() is None:
                return spare
            _close_stdin(spare)  # died idle (killed from outside): reaped by poll()
        return self._start()

    def refill(self) -> None:
        """Start the next spare unless there is one (best effort: a run never fails here)."""
        with self._lock:
            if self._spare is not None:
                return
        try:
            spare = self._start()
        except OSError:
            return
        with self._lock:
            if self._spare is None:
                self._spare = spare
                return
        _dismiss(spare)  # another thread refilled first

    def close(self) -> None:
        """Let the spare go (its gateway stops): it reads EOF and exits."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            _dismiss(spare)

    def _start(self) -> subprocess.Popen[bytes]:
        # -I: no PYTHON* variables, no user site, no script dir on sys.path; -S: no site
        # import. The supervisor needs the stdlib only.
        chosen = platform.supervisor_spec()
        popen = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", SUPERVISOR_BOOT, str(chosen["platform"]),
             *chosen["platform_path"]],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd="/", env={},  # holds no directory and no secret of anyone's
            **platform.current().detach_kwargs(),  # a session and group of its own: pgid == pid
        )
        # At once: its start (an interpreter) must not compete with this gateway's heartbeat
        # at full priority. The run's own values come with its spec.
        proc.lower_priority(popen.pid, self._nice_increment)
        return popen


def hand_over(popen: subprocess.Popen[bytes], spool_dir: Path, token: str,
              env: dict[str, str], finalizer: dict[str, Any] | None = None) -> None:
    """Give a waiting supervisor its run, and how to start this gateway's finalizer once the
    run ended with this gateway gone (gateway/jobs/finalizer.py: it may carry the store's
    DSN, so it goes through this pipe, never a file). Raises OSError (EPIPE) if the
    supervisor died meanwhile."""
    assert popen.stdin is not None
    message = json.dumps({"spool_dir": str(spool_dir), "token": token, "env": env,
                          "finalizer": finalizer})
    try:
        popen.stdin.write(message.encode("utf-8"))
    finally:
        _close_stdin(popen)


def _close_stdin(popen: subprocess.Popen[bytes]) -> None:
    if popen.stdin is not None:
        with contextlib.suppress(OSError):
            popen.stdin.close()


def _dismiss(spare: subprocess.Popen[bytes]) -> None:
    _close_stdin(spare)
    threading.Thread(target=_reap, args=(spare,), name=f"spare-{spare.pid}",
                     daemon=True).start()


def _reap(spare: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
        spare.wait(timeout=10)
    if spare.poll() is None:  # never read its EOF: it holds no run, nothing is lost
        with contextlib.suppress(OSError):
            os.killpg(spare.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            spare.wait()
