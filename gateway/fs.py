"""Private directories: every directory the gateway creates is 0700, whatever the umask.

Job rows, spool files (prompts, outputs) and the config (tokens) live under them, so other
users must not even list them (a spool directory's name is a job id). One helper for the
SQLite store's directory, the spool directories and `init`'s config directory.
"""

from __future__ import annotations

import os
import stat
from contextlib import suppress
from pathlib import Path

import structlog

from gateway.config import gateway_home

log = structlog.get_logger(__name__)

PRIVATE_DIR_MODE = 0o700


def shared_dir_problem(directory: Path) -> str | None:
    """Why `directory` (if it exists) is unsafe to keep the gateway's state in: writable by
    group or others, or owned by another user. Such a dir let another user plant a forged
    spool that the next gateway adopted (issue 23, item 2): the gateway refuses to start
    (setup_error) rather than warn. None: safe, or not made yet (it is made 0700)."""
    try:
        info = directory.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{directory} cannot be checked ({exc.strerror or exc})"
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        return (f"{directory} is owned by uid {info.st_uid}, not by the gateway's user "
                f"(uid {os.geteuid()}): use a directory of your own")
    if mode & 0o022:
        return (f"{directory} is writable by other users (mode {oct(mode)}): "
                f"run `chmod 700 {directory}`")
    return None


def ensure_private_dir(directory: Path) -> None:
    """Create `directory` and its missing parents 0700; tighten the gateway's own home if
    it is looser. A looser directory the user chose is left alone, with a warning."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        with suppress(FileExistsError):  # another process created it a moment ago
            os.mkdir(path, PRIVATE_DIR_MODE)
        os.chmod(path, PRIVATE_DIR_MODE)  # the umask may have removed bits, never adds
    if missing:
        return
    mode = stat.S_IMODE(directory.stat().st_mode)
    if directory == gateway_home() and mode != PRIVATE_DIR_MODE:
        os.chmod(directory, PRIVATE_DIR_MODE)
    elif mode & 0o077:
        # A directory the user chose: not ours to change, but worth saying.
        log.warning("gateway directory is accessible to other users", action="private_dir",
                    directory=str(directory), mode=oct(mode))
