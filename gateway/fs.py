"""Private directories: every directory the gateway creates is 0700, whatever the umask,
and is the directory it made, never another user's link.

Job rows, spool files (prompts, outputs) and the config (tokens) live under them, so other
users must not even list them (a spool directory's name is a job id). One helper for the
SQLite store's directory, the spool directories and `init`'s config directory, and the
checks the gateway makes of its state dir before it starts (runtime.py).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from contextlib import suppress
from pathlib import Path

import structlog

from gateway.config import gateway_home

log = structlog.get_logger(__name__)

PRIVATE_DIR_MODE = 0o700
# The kernel's own bound on the links one path lookup follows (MAXSYMLINKS): a loop ends here.
MAX_LINK_HOPS = 40
# Opens a directory the gateway just made without following a link planted at its name.
NOFOLLOW_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def foreign_link_problem(directory: Path) -> str | None:
    """Why the way to `directory` is not the gateway's own: a symlink on it lies in a
    directory every user can write and is owned neither by the gateway's user nor by that
    directory's owner. That is the kernel's `protected_symlinks` rule (which covers sticky
    world-writable dirs such as /tmp; one without the sticky bit is worse), checked here
    whatever the sysctl says: another user who plants `/tmp/x -> a dir of yours` chooses
    where the gateway keeps its jobs, and the directory checks after it see only the
    target, which is ours (issue 38, item 7). Each link is followed as the kernel would,
    relative targets and chains included, up to the first part that does not exist (the
    gateway makes the rest, ensure_private_dir). None: no such link."""
    path = directory if directory.is_absolute() else Path.cwd() / directory  # `..` kept
    real = Path(path.anchor)  # the part resolved so far: no link in it
    pending = list(path.parts[1:])
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            real = real.parent
            continue
        candidate = real / part
        try:
            info = candidate.lstat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{candidate} cannot be checked ({exc.strerror or exc})"
        if not stat.S_ISLNK(info.st_mode):
            real = candidate
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return f"{directory} is reached through more than {MAX_LINK_HOPS} symlinks"
        if problem := _link_problem(candidate, info, real):
            return problem
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            real = Path(target.anchor)
        pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
    return None


def _link_problem(link: Path, info: os.stat_result, holder: Path) -> str | None:
    """Why the symlink `link` (lstat `info`) in the directory `holder` must not be followed."""
    me = os.geteuid()
    try:
        around = holder.stat()
    except OSError as exc:
        return f"{holder} cannot be checked ({exc.strerror or exc})"
    if info.st_uid in (me, around.st_uid) or not around.st_mode & stat.S_IWOTH:
        return None
    return (f"the way to it passes {link}, a symlink owned by uid {info.st_uid} in "
            f"{holder}, a directory every user can write (mode "
            f"{oct(stat.S_IMODE(around.st_mode))}): whoever planted the link chooses where the "
            f"gateway keeps its jobs. Point [persistence] path (the state dir is its "
            f"directory; with PostgreSQL ~/.agent-cli-gateway) at a directory of your own "
            f"that no other user's link leads to")


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
        _own_made_dir(path)
    if missing:
        return
    mode = stat.S_IMODE(directory.stat().st_mode)
    if directory == gateway_home() and mode != PRIVATE_DIR_MODE:
        os.chmod(directory, PRIVATE_DIR_MODE)
    elif mode & 0o077:
        # A directory the user chose: not ours to change, but worth saying.
        log.warning("gateway directory is accessible to other users", action="private_dir",
                    directory=str(directory), mode=oct(mode))


def _own_made_dir(path: Path) -> None:
    """Make sure `path`, which the gateway has just made (or found made a moment ago), is a
    real directory of its own, and 0700 (the umask may have removed bits, never adds). It
    is opened without following a link, so a link planted at the name (or the dangling one
    that made `exists()` false) is refused rather than followed and chmodded, and nothing
    is created at its target. Raises OSError naming the path."""
    try:
        fd = os.open(path, NOFOLLOW_DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise OSError(errno.ELOOP, "a symlink where the gateway makes a directory; it is "
                                       "never followed: remove it", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PermissionError(errno.EPERM, f"made by uid {info.st_uid}, not by the "
                                               f"gateway's user (uid {os.geteuid()})", str(path))
        os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)


def ensure_private_file(path: Path, mode: int) -> None:
    """Create a file the gateway keeps (the SQLite database: its -wal/-shm copy the mode)
    with `mode` before anything else opens it. A new file is created where the path says,
    never through a link at its name (issue 38, item 7: O_EXCL refuses any link, dangling
    too); an existing one, a link the user made to their database included, is opened as it
    is, and is never created at a link's target."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        fd = os.open(path, os.O_RDWR)
    os.close(fd)
    if stat.S_IMODE(path.stat().st_mode) != mode:
        os.chmod(path, mode)


def write_private_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data` by a rename, so a reader sees the old file or the new one,
    never half of one; the file is `mode` (the user's only) from its creation, in a private
    directory made if missing. The temporary name is per process (two writers never share
    one) and is removed if anything fails."""
    ensure_private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(fd, mode)  # a crashed writer's leftover keeps its mode otherwise
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with suppress(OSError):
            temporary.unlink()
        raise


def uncreatable(path: Path) -> str | None:
    """Why the gateway could not create `path` (doctor, and the reading commands before they
    say "no jobs yet"), or None. Permission bits do not tell (root
    passes every check, yet nothing can be made on a virtual or read-only filesystem), so a
    probe directory is made and removed next to where the store's directories would start:
    nothing is left behind."""
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".agent-cli-gateway-doctor-", dir=ancestor))
    except OSError as exc:
        return f"cannot create anything in {ancestor}: {exc.strerror or exc}"
    return None
