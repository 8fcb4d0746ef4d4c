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
