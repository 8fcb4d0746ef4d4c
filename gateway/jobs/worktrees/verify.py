"""What the gateway checks before it trusts a job's worktree with a commit or a removal.

A job can write everything under its worktree (the `.git` file included), the worktree's
admin dir in the repository (`<common dir>/worktrees/<name>`: HEAD, gitdir, commondir) and
the record beside the worktree. None of that decides what the gateway commits or deletes
(#38): the facts come from the job's row (the plan made at admission: path, branch, common
dir) and each is checked against the disk before git acts:
- the path is a real directory, not a symlink, at its recorded real location;
- its `.git` file names the admin dir git made for it, and that admin dir names it back;
- the repository lists it (`git worktree list --porcelain`) at that path on the job's branch,
  and its HEAD is that branch;
- the common dir is the repository's, a real directory.
A worktree that fails is `tampered`: never committed, never removed, left for a person.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Protocol

from gateway.jobs.worktrees.git import (
    GitError,
    GitPlace,
    git,
    git_text,
    linked_worktree,
    repository,
)

GITDIR_PREFIX = "gitdir: "
MAX_POINTER_BYTES = 4096  # a `.git` or `gitdir` file is one line


class WorktreeSpot(Protocol):
    """What a worktree is from the store's point of view (a WorktreePlan)."""

    path: str
    branch: str
    common_dir: str


def admin_dir(spot: WorktreeSpot) -> str:
    """The worktree's admin dir: git names it after the path's last part (create.py makes
    sure nothing else holds that name before `git worktree add`)."""
    return os.path.join(spot.common_dir, "worktrees", Path(spot.path).name)


def place_of(spot: WorktreeSpot) -> GitPlace:
    """The explicit place of every git call on the job's worktree."""
    return linked_worktree(spot.common_dir, admin_dir(spot), spot.path)


def real_directory(path: str) -> str | None:
    """Why `path` is not a real directory at its own real location (None: it is)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path!r} is gone"
    except OSError as exc:
        return f"{path!r} cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(info.st_mode):
        return f"{path!r} is a symlink (to {os.readlink(path)!r}), not the worktree made"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path!r} is not a directory"
    if os.path.realpath(path) != os.path.normpath(path):
        return (f"{path!r} resolves to {os.path.realpath(path)!r}: a directory on its way "
                f"was replaced by a symlink")
    return None


def _pointer(file: str) -> str | None:
    """The path a `gitdir: <path>` file names, real; None when it is not such a file."""
    try:
        info = os.lstat(file)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_POINTER_BYTES:
            return None
        with open(file, "rb") as fh:
            text = fh.read(MAX_POINTER_BYTES).decode("utf-8", "surrogateescape").strip()
    except OSError:
        return None
    if text.startswith(GITDIR_PREFIX):
        text = text[len(GITDIR_PREFIX):]
    return os.path.realpath(text) if text else None


def registered_branch(spot: WorktreeSpot) -> str | None:
    """The branch the repository lists for a worktree at spot.path ("" detached; None: it
    lists no worktree there)."""
    out = git(["worktree", "list", "--porcelain", "-z"], repository(spot.common_dir))
    found: str | None = None
    for entry in out.decode("utf-8", "surrogateescape").split("\0\0"):
        fields = dict(f.partition(" ")[::2] for f in entry.split("\0") if f)
        if os.path.normpath(fields.get("worktree", "")) == os.path.normpath(spot.path):
            found = fields.get("branch", "")
    return found


def _head_ref(spot: WorktreeSpot) -> str:
    """The ref the worktree's HEAD names ("": detached)."""
    try:
        return git_text(["symbolic-ref", "--quiet", "HEAD"], place_of(spot))
    except GitError as err:
        if err.stderr:
            raise
        return ""


def tampering(spot: WorktreeSpot) -> list[str]:
    """Everything that is not as the gateway made it (empty: the worktree can be trusted).
    Checks the disk first, then asks git only when the disk is right."""
    problems = []
    common = spot.common_dir
    if os.path.realpath(common) != os.path.normpath(common) or not os.path.isdir(common):
        problems.append(f"the repository's git dir {common!r} is not a real directory")
    where = real_directory(spot.path)
    if where is not None:
        return [*problems, where]
    admin = admin_dir(spot)
    if real_directory(admin) is not None:
        problems.append(f"git's admin dir of the worktree {admin!r} is missing or a symlink")
    elif _pointer(os.path.join(admin, "gitdir")) != os.path.realpath(
            os.path.join(spot.path, ".git")):
        problems.append(f"{admin}/gitdir does not name this worktree")
    if _pointer(os.path.join(spot.path, ".git")) != os.path.realpath(admin):
        problems.append(f"{spot.path}/.git does not name the worktree's own git dir "
                        f"{admin!r} (it was rewritten)")
    if problems:
        return problems
    try:
        listed = registered_branch(spot)
        head = _head_ref(spot)
    except GitError as err:
        return [f"git cannot read the worktree: {err.message}"]
    expected = f"refs/heads/{spot.branch}"
    if listed != expected:
        problems.append(f"the repository lists no worktree at {spot.path!r} on {expected} "
                        f"(found: {listed!r})")
    if head != expected:
        problems.append(f"the worktree's HEAD is {head or 'detached'!r}, not {expected}")
    return problems
