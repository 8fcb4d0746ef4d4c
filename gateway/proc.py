"""Process identity and process-group signalling (POSIX platform code, kept in one place).

Why a module of its own: every rule here exists because of an operating-system detail that is
easy to get wrong and hard to see in a test run on one machine - pid reuse, zombies, reaped
group leaders, init processes that never reap. The comments give those reasons.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
from pathlib import Path

import psutil
import structlog

log = structlog.get_logger(__name__)

# psutil derives create_time from the kernel's start tick (1/100 s) plus the boot time, and the
# boot time it reads (/proc/stat btime, whole seconds computed from the wall clock) can move by
# a second when the clock is stepped. Another process can only reuse a pid after the pid space
# wraps, which takes far longer than this, so a 1 s window never confuses two processes.
START_TIME_TOLERANCE_S = 1.0

_LINUX_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")
MAX_NICE = 19  # the lowest priority a process can have


def boot_id() -> str:
    """An id of the current boot of this host.

    A pid and a process start time only identify a process within one boot: after a reboot the
    same pid can be handed out again at a similar clock time. Linux gives a random id per boot;
    elsewhere the boot time (stable for the life of the boot) stands in for it.
    """
    try:
        return _LINUX_BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        return f"boot-{int(psutil.boot_time())}"


def hostname() -> str:
    """This host's name (two containers can share one: pair it with boot_id())."""
    return socket.gethostname()


def process_start_time(pid: int) -> float | None:
    """The start time of `pid` in epoch seconds, or None when no such process exists."""
    if pid <= 0:
        return None
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def is_process_alive(pid: int, started_at: float) -> bool:
    """True when `pid` is running, is not a zombie, and is the process that started at
    `started_at` (a reused pid belongs to some other program, not to our job)."""
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            # A zombie has finished; only its exit status waits to be collected.
            return False
        return bool(abs(process.create_time() - started_at) <= START_TIME_TOLERANCE_S)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        # Another user's process that we may not inspect cannot be a job we spawned.
        return False


def process_owner(pid: int) -> tuple[int, list[str]] | None:
    """The real uid and the command line of `pid`; None when it is gone, a zombie, or may
    not be inspected. What an adopter checks before it trusts a spool's claim that `pid` is
    a supervisor of this user (a forged claim can name any process)."""
    if pid <= 0:
        return None
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
    members: list[int] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
            # Zombies are dead. They are counted out because they can linger forever: orphans
            # are reparented to pid 1, and an init that never reaps (some containers, PID 1
            # shims without subreaping) leaves their zombies in the group indefinitely.
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except (PermissionError, psutil.AccessDenied):
            members.append(pid)  # cannot inspect: assume it is running
    return members


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
        pass  # gone already, or a platform without it: nothing to lower
    own = autogroup_nice(os.getpid())
    if own is None or not _autogroups_enabled():
        return True
    try:
        with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as handle:
            handle.write(str(min(MAX_NICE, own + increment)))
    except OSError as exc:
        return exc.errno != errno.EAGAIN
    return True


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s autogroup (Linux with autogroup support), else None."""
    # The file reads like "/autogroup-1234 nice 0".
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text(encoding="ascii")
        return int(text.split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _autogroups_enabled() -> bool:
    try:
        return _AUTOGROUP_ENABLED.read_text(encoding="ascii").strip() == "1"
    except OSError:
        return False
