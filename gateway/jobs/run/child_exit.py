"""Learning that a spawned child exited, from the child itself, without a thread per child.

Why not asyncio's own subprocess support: on Python 3.11 it watches every child with
`ThreadedChildWatcher`, which starts one thread per child blocked in waitpid(), and it runs
fork/exec on the event loop. Under a burst of jobs both cost the loop milliseconds per job
(bench/README.md, "async admission"). The platform (gateway/platform) gives an exit watch: a
descriptor that becomes readable when its process exits (on Linux a process fd, on macOS a
kqueue with a process-exit filter, with `portable` forced on Linux a pipe that a thread
blocked in waitid(WNOWAIT) writes to), so the event loop watches any number of children
through its selector; waitpid() then collects the status and reaps the zombie. Where the
platform has none (an old kernel, a seccomp filter) one daemon thread per child waits
instead, which is what asyncio does anyway.

Invariant: exactly one waitpid() collects each child, and only after it exited. The watcher
is the only caller of waitpid() for its pid (the `Popen` object it holds is told the
returncode, so its finalizer never polls); one at a time: the loop's reader, or, once the
reader is removed, one background thread. An unreaped child keeps its pid, so until this
watcher reaps it, a signal sent to that pid (or its process group) can only reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading

from gateway import platform
from gateway.platform import ExitWatch

# What asyncio reports when the child was reaped by someone else and its status is lost.
UNKNOWN_RETURNCODE = 255


def open_exit_watch(pid: int) -> ExitWatch | None:
    """The platform's exit watch for child `pid`, or None where it has none.

    Call it before the child can be reaped (right after the spawn, by its parent): the pid
    cannot be reused until then, so the watch names this child even if it already exited.
    """
    return platform.current().exit_watch(pid)


class ChildExit:
    """The exit of one child we spawned: `exited` resolves with its returncode (negative:
    killed by that signal, as `Popen.returncode`) once the child has been reaped.

    Create it on the event loop, right after the spawn, with the watch `open_exit_watch` gave.
    """

    def __init__(self, popen: subprocess.Popen[bytes], watch: ExitWatch | None) -> None:
        self.pid = popen.pid
        self._popen = popen  # kept (and told the returncode) so that it never reaps itself
        self._watch = watch
        self._reaped = False
        self._loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self._loop.create_future()
        if watch is not None:
            self._loop.add_reader(watch.fileno(), self._on_readable)
        else:
            self._wait_in_thread()

    @property
    def reaped(self) -> bool:
        return self._reaped

    def reap_in_background(self) -> None:
        """Hand the reaping to a daemon thread: for when the event loop may close before the
        child exits (a cancelled supervisor that has just SIGKILLed the group). Without it
        the killed child would stay a zombie of the gateway."""
        if self._reaped or self._watch is None:
            return  # done already, or a thread is waiting for it anyway
        self._close_watch()
        self._wait_in_thread()

    # -- internals ----------------------------------------------------------------------------

    def _reap(self, flags: int) -> int | None:
        """waitpid() for our child; its returncode, or None while it still runs."""
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:
            returncode = UNKNOWN_RETURNCODE
        else:
            if pid == 0:
                return None
            returncode = os.waitstatus_to_exitcode(status)
        self._reaped = True
        self._popen.returncode = returncode
        return returncode

    def _on_readable(self) -> None:
        returncode = self._reap(os.WNOHANG)
        if returncode is None:
            return  # not exited after all: keep watching
        self._close_watch()
        self._resolve(returncode)

    def _resolve(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            self._loop.remove_reader(watch.fileno())
            watch.close()

    def _wait_in_thread(self) -> None:
        def wait() -> None:
            returncode = self._reap(0)
            assert returncode is not None  # a blocking waitpid returns only once it exited
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._resolve, returncode)

        threading.Thread(target=wait, name=f"reap-{self.pid}", daemon=True).start()
