"""Process identity and process-group signalling: the rules that hold on every POSIX system.

Why a module of its own: every rule here exists because of an operating-system detail that is
easy to get wrong and hard to see in a test run on one machine - pid reuse, zombies, reaped
group leaders, init processes that never reap. The comments give those reasons. The facts
that differ by OS (start times, boot ids, who is in a group, autogroups) come from the
platform implementation in use (gateway/platform).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterable

import structlog

from gateway import platform

log = structlog.get_logger(__name__)

# A start time is the kernel's start tick (1/100 s) plus the boot time, and the boot time
# (whole seconds computed from the wall clock) can move by a second when the clock is stepped.
# Another process can only reuse a pid after the pid space wraps, which takes far longer than
# this, so a 1 s window never confuses two processes.
START_TIME_TOLERANCE_S = 1.0
MAX_NICE = 19  # the lowest priority a process can have


def boot_id() -> str:
    """An id of the current boot of this host.

    A pid and a process start time only identify a process within one boot: after a reboot the
    same pid can be handed out again at a similar clock time (gateway/platform says where
    each implementation finds it).
    """
    return platform.current().boot_id()


def hostname() -> str:
    """This host's name (two containers can share one: pair it with boot_id())."""
    return socket.gethostname()


def process_start_time(pid: int) -> float | None:
    """The start time of `pid` in epoch seconds, or None when no such process exists."""
    state = platform.current().process_state(pid)
    return None if state is None else state[0]


def is_process_alive(pid: int, started_at: float) -> bool:
    """True when `pid` is running, is not a zombie, and is the process that started at
    `started_at` (a reused pid belongs to some other program, not to our job). A process we
    may not inspect (another user's) cannot be a job we spawned: not alive."""
    state = platform.current().process_state(pid)
    if state is None:
        return False
    start, zombie = state
    # A zombie has finished; only its exit status waits to be collected.
    return not zombie and abs(start - started_at) <= START_TIME_TOLERANCE_S


def process_owner(pid: int) -> tuple[int, list[str]] | None:
    """The real uid and the command line of `pid`; None when it is gone, a zombie, or may
    not be inspected. What an adopter checks before it trusts a spool's claim that `pid` is
    a supervisor of this user (a forged claim can name any process)."""
    if pid <= 0:
        return None
    import psutil  # deferred: start-up (tools/list imports none of the process machinery)

    try:
        process = psutil.Process(pid)
        return int(process.uids().real), list(process.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _refuse_own_group(pgid: int) -> bool:
    # killpg(0, ...) means "my own group" and pgid 1 is init's: a bad row must never make the
    # gateway signal itself or the whole machine.
    return pgid <= 1 or pgid == os.getpgrp()


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to every member of process group `pgid`. True when it was sent.

    The caller passes the pgid it recorded at spawn (with start_new_session the leader's pid
    is the pgid). Never ask the OS with getpgid(leader): it fails once the leader has been
    reaped, while the rest of the group may still be running. A group whose leader is gone is
    still signalled as a group, which is how grandchildren are reached.

    Returns False when the group no longer exists (ESRCH) or we may not signal it (EPERM,
    logged: on Linux it means no member was signalled, never that the group is gone).
    """
    if _refuse_own_group(pgid):
        log.warning("refused to signal process group", action="signal_group", pgid=pgid)
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group", action="signal_group",
                    pgid=pgid, signal=int(sig))
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in group `pgid`."""
    if _refuse_own_group(pgid):
        return []
    try:
        # Fast path: ESRCH proves that no process, not even a zombie, is left in the group.
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # members exist that we may not signal; look at them below
    # Zombies are dead. They are counted out because they can linger forever: orphans are
    # reparented to pid 1, and an init that never reaps (some containers, PID 1 shims without
    # subreaping) leaves their zombies in the group indefinitely.
    return platform.current().group_members(pgid)


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` is running (zombies do not count)."""
    return bool(group_members(pgid))


def signal_name(sig: int) -> str:
    """'SIGKILL' for 9; the number as text for an unknown signal."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def lower_priority(pid: int, increment: int) -> bool:
    """Make the process group led by `pid` yield the CPU to this process: `increment` nice
    levels below our own, for its members and, on Linux with autogroup scheduling, for its
    autogroup. Best effort: errors are swallowed (a run never fails for its priority).

    Why the autogroup: with `kernel.sched_autogroup_enabled` the scheduler shares the CPU
    between sessions first and between processes only inside a session. Each provider runs
    in a session of its own (start_new_session), so its own nice value would only rank it
    against its own children; the autogroup's nice value is what ranks it against the
    gateway. Call it right after the spawn: the session (and its autogroup) exists once the
    child has exec'd, and children the provider starts later inherit both.

    Returns False only when it is worth calling again later: the kernel lets a process
    without CAP_SYS_ADMIN change an autogroup's nice value at most once per 100 ms
    (EAGAIN), which a burst of spawns runs into.
    """
    if _refuse_own_group(pid):
        return True
    try:
        target = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, 0) + increment)
        # PRIO_PGRP: every thread of every member, not only the leader's main thread.
        os.setpriority(os.PRIO_PGRP, pid, target)
    except OSError:
        pass  # gone already: nothing to lower
    implementation = platform.current()
    own = implementation.autogroup_nice(os.getpid())
    if own is None:
        return True
    return implementation.set_autogroup_nice(pid, own + increment)


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s autogroup (Linux with autogroup support), else None."""
    return platform.current().autogroup_nice(pid)


def keep_secrets_from_children(read_names: Iterable[str]) -> bool:
    """Keep this process's secrets from the processes of the same user it starts (issue 23):
    a provider CLI could otherwise walk up to the gateway and read its environment.

    Two steps. The platform's make_non_dumpable (Linux: nobody of the same uid may read this
    process's environment or memory, whatever it still holds: PGPASSWORD and API keys are
    read at each use). Then `read_names`, the variables whose values the gateway has read
    into its settings and never reads again, leave the environment, their values
    overwritten where the OS shows them to other processes (the memory the process started
    with: the environ file in procfs on Linux, sysctl KERN_PROCARGS2 on macOS), which is the only
    protection where the platform has no non-dumpable mode. Returns what make_non_dumpable
    returned."""
    done = platform.current().make_non_dumpable()
    wanted = {name.upper() for name in read_names}  # settings' variable names ignore case
    for name in [key for key in os.environ if key.upper() in wanted]:
        _forget_variable(name)
    return done


def _forget_variable(name: str) -> None:
    value = os.environb.get(name.encode("utf-8", "surrogateescape"))
    if value is None:
        return
    with contextlib.suppress(OSError, AttributeError, ValueError):
        import ctypes  # deferred: start-up (only a serving gateway needs it, once)

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        libc.getenv.argtypes = [ctypes.c_char_p]
        address = libc.getenv(name.encode("utf-8", "surrogateescape"))
        # getenv gives the C string whose length is the value's: nothing past it is touched.
        if address and ctypes.string_at(address, len(value)) == value:
            ctypes.memset(address, 0, len(value))
    os.environ.pop(name, None)
