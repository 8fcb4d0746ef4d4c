"""The `linux` platform: process facts read from /proc, exit waits on a pidfd.

One of the two implementations of gateway/platform (the other is portable.py); both define
the same names, and gateway/platform/__init__.py says what each one means. Stdlib only and
self-contained: a run's supervisor imports this file as a top-level module (`python -I -S`,
no site, no gateway package), so it may import nothing of the gateway.

Why /proc and not psutil: psutil computes a Linux process's create_time as the boot time of
/proc/stat (`btime`) plus the start tick of /proc/<pid>/stat, which is exactly what
`process_start_time` reads here; the supervisor (which has no psutil) and the gateway agree
on every start time that way, and a group scan over /proc costs one getpgid() per process
and one read per member.
"""

from __future__ import annotations

import contextlib
import ctypes  # prctl; imported at the top so a spare supervisor has it before its run comes
import errno
import os

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

NAME = "linux"
# What make_non_dumpable() does here, in the words gateway_status and the docs use.
NON_DUMPABLE = "prctl(PR_SET_DUMPABLE, 0): another process of the same user cannot read " \
               "this one's /proc/<pid>/environ or memory, nor attach a debugger"

_PROC = "/proc"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_AUTOGROUP_ENABLED = "/proc/sys/kernel/sched_autogroup_enabled"
_PR_SET_DUMPABLE = 4  # <linux/prctl.h>
MAX_NICE = 19


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("ascii", "replace")


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        text = _read(f"{_PROC}/{pid}/stat")
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces and ')'.
    fields = text.rsplit(")", 1)[-1].split()
    return fields if len(fields) > 19 else None


def _boot_time() -> float | None:
    try:
        for line in _read(f"{_PROC}/stat").splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def boot_id() -> str:
    """The kernel's random id of this boot (a pid and start time identify a process only
    within one boot)."""
    try:
        return _read(_BOOT_ID).strip()
    except OSError:
        boot = _boot_time()
        return f"boot-{int(boot or 0)}"


def process_state(pid: int) -> tuple[float, bool] | None:
    """(start time in epoch seconds, is a zombie) of `pid`, or None when there is none."""
    if pid <= 0:
        return None
    fields = _stat_fields(pid)
    boot = _boot_time()
    if fields is None or boot is None:
        return None
    try:
        ticks = int(fields[19])
    except ValueError:
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK"), fields[0] == "Z"


def own_start_time() -> float | None:
    """This process's start time, as process_state(os.getpid()) gives it to the gateway."""
    state = process_state(os.getpid())
    return None if state is None else state[0]


def group_members(pgid: int, exclude: int | None = None) -> list[int]:
    """Pids of the live (non-zombie) processes of group `pgid`, except `exclude`.

    Zombies are counted out: they can linger forever in a group whose init never reaps.
    Each pid is sorted by getpgid() first, a system call, and only the group's members have
    their stat file read: reading every process's stat costs tens of milliseconds on a busy
    box (the kernel locks each task to render it), and a supervisor asks this the moment
    its CLI exits, on the path of every sync request.
    """
    found: list[int] = []
    try:
        names = os.listdir(_PROC)
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            if os.getpgid(int(name)) != pgid:
                continue
        except OSError:
            continue  # exited meanwhile (ESRCH)
        fields = _stat_fields(name)
        if fields is None:
            continue  # exited meanwhile
        with contextlib.suppress(ValueError):
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(name))
    return found


class _PidFd:
    """A pidfd: readable once its process has exited."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def exit_watch(pid: int) -> _PidFd | None:
    """A selectable handle that turns readable when `pid` exits (a pidfd), or None where the
    kernel offers none (before 5.3, a seccomp filter): the caller then polls.

    Open it before the child can be reaped (right after the spawn, by its parent): the pid
    cannot be reused until then, so the handle names this child even if it already exited.
    """
    pidfd_open: Any = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return _PidFd(int(pidfd_open(pid)))
    except OSError:
        return None


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s autogroup, or None without autogroup scheduling."""
    try:
        # The file reads like "/autogroup-1234 nice 0".
        return int(_read(f"{_PROC}/{pid}/autogroup").split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _autogroups_enabled() -> bool:
    try:
        return _read(_AUTOGROUP_ENABLED).strip() == "1"
    except OSError:
        return False


def set_autogroup_nice(pid: int, value: int) -> bool:
    """Set the nice value of `pid`'s autogroup (0: this process). False only when worth
    retrying later: an unprivileged process may change an autogroup's nice value at most
    once per 100 ms (EAGAIN), which a burst of spawns runs into. Best effort otherwise."""
    if not _autogroups_enabled():
        return True
    target = "self" if pid == 0 else str(pid)
    try:
        # Bytes: a text-mode open would import its codec in every forked supervisor.
        fd = os.open(f"{_PROC}/{target}/autogroup", os.O_WRONLY)
        try:
            os.write(fd, str(min(MAX_NICE, value)).encode())
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno != errno.EAGAIN
    return True


def make_non_dumpable() -> bool:
    """Keep processes of the same user out of this one (see NON_DUMPABLE). True when done.

    It lasts until this process execs: a child it starts (a provider CLI) is dumpable again,
    which is right: it holds only its own environment. Call it after set_autogroup_nice(0):
    the /proc files of a non-dumpable process belong to root, so it can no longer write its
    own autogroup file.
    """
    return _set_dumpable(0)


def make_dumpable() -> bool:
    """Undo make_non_dumpable (a supervisor forked by a non-dumpable zygote must write its own
    autogroup file once, then it calls make_non_dumpable again). True when done."""
    return _set_dumpable(1)


def _set_dumpable(value: int) -> bool:
    try:
        return int(_libc().prctl(_PR_SET_DUMPABLE, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


_LIBC: list[Any] = []


def _libc() -> Any:
    """libc, loaded once per process: a zygote loads it before it forks (every supervisor
    calls prctl twice), and a dlopen per call cost each run."""
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]
