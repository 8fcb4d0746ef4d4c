"""What an adopter checks before it trusts a run's spool (issue 23, item 2).

Adoption acts on a spool: it completes the job with the spool's end record and output, and
it signals the process group its start record names. In a state dir another user could
write, a forged spool (a planted `run.json`, a `start.json` naming someone else's process,
an `end.json` and `stdout`) was adopted: the job completed with the forged answer and the
named group was SIGKILLed. The gateway now refuses such a state dir at start
(gateway.fs.shared_dir_problem); this module is the second line, for each spool adopted:

- the spool dir and every record in it are this user's, private (no group or other bits),
  and not symlinks (files are opened with O_NOFOLLOW and checked with fstat on the open
  file, so the check is of the file that would be read);
- the start record carries the launch token of `run.json` (the supervisor copies it into
  its claim), so a claim and a spec from two different launches do not match. A claim of
  record version 1 (a 0.1.0 supervisor, which wrote no token) is read as that release wrote
  it: release N adopts N-1's runs, and the ownership checks above and below still hold;
- the claimed supervisor leads its group (pgid == pid) and, while its pid is alive, it is
  that process (its start time), it belongs to this user (real uid), and it runs the
  supervisor (its command line).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from gateway import proc
from gateway.jobs.run import spool
from gateway.jobs.run import supervisor as sup

REQUIRED = (sup.RUN_NAME, sup.START_NAME)
# temp_cwd.json too: the adopter removes the dir it names.
OPTIONAL = (sup.END_NAME, sup.STOP_NAME, sup.STDOUT_NAME, sup.STDERR_NAME, spool.TEMP_CWD_NAME)


def _owner_problem(info: os.stat_result, what: str) -> str | None:
    if info.st_uid != os.geteuid():
        return f"{what} is owned by uid {info.st_uid}, not by this gateway's user"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{what} is accessible to other users (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def _file_problem(path: Path, required: bool) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{path.name} is missing" if required else None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path.name} is a symbolic link"
        return f"{path.name} cannot be opened ({exc.strerror or exc})"
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        return f"{path.name} is not a regular file"
    return _owner_problem(info, path.name)


def _is_supervisor_command(cmdline: list[str]) -> bool:
    """`python -I -S -c <boot>`, the command line of a zygote (forks.py) and so of every
    supervisor it forked, of a 0.1.0 spare (it imported the supervisor), or
    `python -I -S .../supervisor.py ...` (a supervisor started by hand, or by 0.1.0)."""
    return "-I" in cmdline and any(
        "import zygote" in arg or "import supervisor" in arg
        or arg.endswith(os.sep + "supervisor.py") for arg in cmdline)


def _supervisor_problem(pid: int, started_at: float) -> str | None:
    found = proc.process_start_time(pid)
    if found is None or not proc.is_process_alive(pid, found):
        # gone, or a zombie (finished; only its status waits to be collected): nothing of it
        # to trust or to signal (its group is checked below)
        return None
    if abs(found - started_at) > proc.START_TIME_TOLERANCE_S:
        return f"pid {pid} is another process than the supervisor the claim names"
    owner = proc.process_owner(pid)
    if owner is None:
        return f"pid {pid} cannot be inspected"
    uid, cmdline = owner
    if uid != os.geteuid():
        return f"pid {pid} belongs to uid {uid}, not to this gateway's user"
    if not _is_supervisor_command(cmdline):
        return f"pid {pid} is not a run supervisor"
    return None


def adoption_problem(spool_dir: Path, start: dict[str, Any]) -> str | None:
    """Why the run in `spool_dir`, claimed by `start`, must not be adopted; None: trusted."""
    try:
        info = os.lstat(spool_dir)
    except OSError as exc:
        return f"the spool dir cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(info.st_mode):
        return "the spool dir is not a directory (a symbolic link?)"
    problem = _owner_problem(info, "the spool dir")
    for name in REQUIRED + OPTIONAL:
        problem = problem or _file_problem(spool_dir / name, name in REQUIRED)
    if problem is not None:
        return problem
    run = sup.read_record(spool_dir, sup.RUN_NAME) or {}
    # A run recorded in a newer spool format is left to a gateway that reads it (never
    # misread): the reader rule of supervisor.RECORD_VERSION.
    for name, record in ((sup.RUN_NAME, run), (sup.START_NAME, start),
                         (sup.END_NAME, sup.read_record(spool_dir, sup.END_NAME))):
        problem = sup.record_version_problem(name, record or None)
        if problem is not None:
            return problem
    tokenless_release = start.get("version") == 1 and "token" not in start  # 0.1.0's claim
    if not tokenless_release and (not run.get("token") or start.get("token") != run.get("token")):
        return "the start record does not carry the run's launch token"
    try:
        pid, pgid, started_at = int(start["pid"]), int(start["pgid"]), float(start["started_at"])
    except (KeyError, TypeError, ValueError):
        return "the start record does not name a supervisor"
    if pid != pgid or pid <= 1:
        return f"the claimed supervisor {pid} does not lead its process group {pgid}"
    return _supervisor_problem(pid, started_at)
