"""The `portable` platform: POSIX without procfs or process fds, which is what macOS and the BSDs run.

The same names as linux.py, meaning the same (gateway/platform/__init__.py). Process facts come
from psutil (on macOS: `create_time` is the kernel's p_starttime, the boot time is
`kern.boottime`); exit waits use a kqueue `KQ_FILTER_PROC`/`KQ_NOTE_EXIT` filter where
`select.kqueue` exists, and elsewhere, for a child of ours, a thread blocked in waitid() that
writes to a pipe (for any other process the caller's bounded poll). CI runs the run-lifecycle
tests under this implementation on Linux, so every line here runs there except the kqueue
call itself (tests/platform/ gives it a stand-in).

Self-contained like linux.py: a supervisor imports it as a top-level module. It needs psutil,
which an isolated interpreter (`python -I -S`) does not find by itself: the gateway passes the
directory psutil was imported from (`supervisor_paths` in gateway/platform/__init__.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading

import psutil

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Detaching is the same on every POSIX system (posix_detach.py). Imported as
# gateway.platform.<name> by the gateway, as a top-level module by a supervisor.
try:
    from gateway.platform.posix_detach import detach_kwargs as detach_kwargs
    from gateway.platform.posix_detach import fork_detached as fork_detached
except ImportError:  # no gateway package: the supervisor's isolated interpreter
    from posix_detach import detach_kwargs as detach_kwargs  # type: ignore[import-not-found,no-redef]
    from posix_detach import fork_detached as fork_detached  # type: ignore[no-redef]

NAME = "portable"
NON_DUMPABLE = ("none: POSIX has no portable way to keep a process of the same user out "
                "(macOS lets it read the arguments and environment through sysctl "
                "KERN_PROCARGS2); the gateway removes what secrets it can from its "
                "environment instead")
MAX_NICE = 19
# Where psutil has no better witness of a boot than its start time (whole seconds).
_BOOT_UUID_SYSCTL = ("sysctl", "-n", "kern.bootsessionuuid")
_BOOT_UUID_TIMEOUT_S = 2.0  # a sysctl answers in milliseconds; bound it anyway


def boot_id() -> str:
    """An id of this boot: macOS's `kern.bootsessionuuid` where it is readable, else the boot
    time, which stays the same for the life of a boot."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(_BOOT_UUID_SYSCTL, capture_output=True, check=False,
                               timeout=_BOOT_UUID_TIMEOUT_S, env={"PATH": "/usr/sbin:/sbin"})
        text = found.stdout.decode("ascii", "replace").strip()
        if found.returncode == 0 and text:
            return text
    return f"boot-{int(psutil.boot_time())}"


def process_state(pid: int) -> tuple[float, bool] | None:
    """(start time in epoch seconds, is a zombie) of `pid`, or None when there is none."""
    if pid <= 0:
        return None
    try:
        process = psutil.Process(pid)
        started = float(process.create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return None
    try:
        zombie = process.status() == psutil.STATUS_ZOMBIE
    except psutil.ZombieProcess:
        zombie = True
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        zombie = False
    return started, zombie


def own_start_time() -> float | None:
    """This process's start time, as process_state(os.getpid()) gives it to the gateway."""
    state = process_state(os.getpid())
    return None if state is None else state[0]


def group_members(pgid: int, exclude: int | None = None) -> list[int]:
    """Pids of the live (non-zombie) processes of group `pgid`, except `exclude`."""
    members: list[int] = []
    for pid in psutil.pids():
        if pid == exclude:
            continue
        try:
            if os.getpgid(pid) != pgid:
                continue
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except (PermissionError, psutil.AccessDenied):
            members.append(pid)  # cannot inspect: assume it is running
    return members


class _KqueueExit:
    """A kqueue holding one KQ_FILTER_PROC/KQ_NOTE_EXIT filter: its descriptor turns readable
    once the process exits. The filter attaches to the process itself, so a later process
    that reuses the pid never fires it."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    def fileno(self) -> int:
        return int(self._queue.fileno())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._queue.close()


class _WaitedExit:
    """The read end of a pipe that a daemon thread writes to once child `pid` has exited.

    Where there is no kqueue (Linux, with this implementation forced) the parent of a
    process can still learn of its exit without a poll: a thread blocks in waitid() with
    WNOWAIT, which wakes at the exit but leaves the child unreaped, so the caller's own
    waitpid() (its ChildExit, the supervisor's Popen.poll) stays the only one that collects
    it. The thread alone owns the write end and closes it: closing the watch closes only the
    read end, so no write can ever land on a reused descriptor number (a late write gets
    EPIPE, which Python reports as an OSError rather than a signal).
    """

    def __init__(self, pid: int) -> None:
        self._read, write = os.pipe()  # close-on-exec (PEP 446): no child inherits either end
        threading.Thread(target=_signal_exit, args=(pid, write), name=f"exit-watch-{pid}",
                         daemon=True).start()

    def fileno(self) -> int:
        return self._read

    def close(self) -> None:
        fd, self._read = self._read, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class _SignalledExit:
    """The read end of a pipe that turns readable once the caller's child `pid` has exited,
    told by SIGCHLD, for a caller in its main thread: the supervisor, which is single-
    threaded. No thread to start beside a CLI that is starting up (that start cost a run
    about 2 ms where the CPU was busy: bench/README.md, the cost rows), and no poll.

    The pipe is also the wakeup fd (`signal.set_wakeup_fd`), so the signal wakes a
    select() on it in whichever thread the kernel delivered it to; the Python-level handler,
    which runs right after in the main thread, empties the pipe again unless `pid` is the
    child that exited: another child's exit is no wake-up. Closing it puts back the handler
    and wakeup fd it replaced."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(self._write)  # ValueError: not main
        except ValueError:
            for fd in (self._read, self._write):
                os.close(fd)
            raise
        self._previous_handler = signal.signal(signal.SIGCHLD, self._on_child_signal)
        self._on_child_signal(signal.SIGCHLD, None)  # it may have exited before the handler

    def _on_child_signal(self, signum: int, frame: object) -> None:
        if self._read < 0:
            return
        with contextlib.suppress(OSError):
            while os.read(self._read, 512):
                pass
        if _child_exited(self._pid) is not False:  # exited, or reaped already
            with contextlib.suppress(OSError):
                os.write(self._write, b"x")

    def fileno(self) -> int:
        return self._read

    def close(self) -> None:
        if self._read < 0:
            return
        signal.signal(signal.SIGCHLD, self._previous_handler)
        signal.set_wakeup_fd(self._previous_fd)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._read = self._write = -1


def _signal_exit(pid: int, write_fd: int) -> None:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # reaped by its waiter already: the watch is late, not wrong
    finally:
        with contextlib.suppress(OSError):
            os.write(write_fd, b"x")
        os.close(write_fd)


def _child_exited(pid: int) -> bool | None:
    """Whether `pid`, a child of this process that nobody has reaped yet, has exited (it
    stays the caller's to collect); None when it is no such child (never ours, or reaped)."""
    waitid: Any = getattr(os, "waitid", None)
    if waitid is None:
        return None  # no waitid (macOS before Python 3.13, which has kqueue anyway)
    try:
        return waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


def exit_watch(pid: int, selector: Any = select
               ) -> _KqueueExit | _SignalledExit | _WaitedExit | None:
    """A selectable handle that turns readable when `pid` exits, or None (the caller then
    polls): a kqueue filter where the OS has one (macOS, the BSDs), else, for a child of
    this process, a waiting thread's pipe (_WaitedExit), else None.

    `selector` is the `select` module (a stand-in in the tests). Registering on a process
    that is already gone fails (ESRCH): None, and the caller's poll sees the exit at once.
    Like the linux one, open it before the child can be reaped (right after the spawn, by
    its parent): until then the pid names this child even if it already exited.
    """
    kqueue = getattr(selector, "kqueue", None)
    if kqueue is None:
        if _child_exited(pid) is None:
            return None
        if threading.current_thread() is threading.main_thread():
            return _SignalledExit(pid)
        return _WaitedExit(pid)
    queue = kqueue()
    try:
        event = selector.kevent(pid, filter=selector.KQ_FILTER_PROC,
                                flags=selector.KQ_EV_ADD | selector.KQ_EV_ONESHOT,
                                fflags=selector.KQ_NOTE_EXIT)
        queue.control([event], 0, 0)
    except OSError:
        queue.close()
        return None
    return _KqueueExit(queue)


def autogroup_nice(pid: int) -> int | None:
    """No autogroup scheduling outside Linux."""
    return None


def set_autogroup_nice(pid: int, value: int) -> bool:
    """Nothing to do outside Linux (done: never worth retrying)."""
    return True


def make_non_dumpable() -> bool:
    """No portable equivalent (see NON_DUMPABLE): False, nothing done."""
    return False


def make_dumpable() -> bool:
    """Nothing was done by make_non_dumpable here, so nothing to undo: True."""
    return True
