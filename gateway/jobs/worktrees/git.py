"""Every git command the worktree code runs: an argv list, a bounded time, no program of the
repository's own.

One home for how git is called, so no call can forget the hardening. A job can write its
worktree, the worktree's admin dir and the repository's config, so nothing there may choose
what git runs or where it acts (#38):
- Where: a command names its git dir (and work tree) explicitly (`GitPlace`): never
  discovery from a directory a job can write, whose `.git` file or symlink could point the
  gateway's commit at the user's branch. Only the caller's own checkout is discovered from
  its path (`checkout`), as the caller named it.
- What runs: hooks off, no fsmonitor daemon, no submodule recursion, no network protocol, no
  pager, ssh command, credential helper, editor, signing or auto-gc; and every clean, smudge
  and process filter the configuration defines is turned off on the command line (stronger
  than any config file), as are external diff drivers and textconv (`--no-ext-diff
  --no-textconv` on every diff). `[worktrees] lfs = true` keeps git-lfs's own filter, with
  its standard commands (not whatever the repository's config says they are).
- How long: each call is its own process group, killed whole at its timeout.
- The location variables a caller's environment may hold (`GIT_DIR`, ...) are dropped, and
  the C locale lets an error's text be read (`lock_error`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT_S = 120.0  # a checkout of a large repository on a slow disk; a hung git is killed
# Configuration every call gets on its command line (stronger than any config file).
HARDENING = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
             "-c", "submodule.recurse=false", "-c", "protocol.allow=never",
             "-c", "core.sshCommand=", "-c", "core.askPass=", "-c", "credential.helper=",
             "-c", "core.pager=cat", "-c", "core.editor=true", "-c", "sequence.editor=true",
             "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false", "-c", "gc.auto=0",
             "-c", "maintenance.auto=false", "-c", "core.sparseCheckout=false",
             "--no-pager", "--no-replace-objects")
# Commands that read attributes and may start a diff driver: told not to, every time.
DIFF_COMMANDS = frozenset({"diff", "show", "log"})
NO_DRIVERS = ("--no-ext-diff", "--no-textconv")
# Commands that neither read file contents through attributes nor start anything: they need
# no look at the configured filters (one git process less each).
PLUMBING = frozenset({"rev-parse", "symbolic-ref", "show-ref", "check-ref-format", "branch",
                      "config", "update-ref", "cat-file"})
FILTER_KEYS = ("clean", "smudge", "process")
LFS_FILTER = ("-c", "filter.lfs.clean=git-lfs clean -- %f",
              "-c", "filter.lfs.smudge=git-lfs smudge -- %f",
              "-c", "filter.lfs.process=git-lfs filter-process", "-c", "filter.lfs.required=true")
# Variables that would point a command at another repository, index or object store.
LOCATION_VARIABLES = frozenset({
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_PREFIX", "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
    "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_SSH", "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH", "GIT_TEMPLATE_DIR", "GIT_CONFIG", "GIT_REPLACE_REF_BASE",
})
# What git prints when another git holds a lock it needs (index.lock, config.lock, a ref's).
LOCK_MESSAGES = ("could not lock", ".lock': file exists", "unable to create '",
                 "cannot lock ref", "is locked")
STDERR_SHOWN_CHARS = 600  # of git's complaint, in an error message
KILLED_WAIT_S = 5.0  # for a killed git's group to be reaped


class GitError(Exception):
    """A git command failed (or could not run); `message` says which and why."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.stderr = stderr

    @property
    def lock_error(self) -> bool:
        """Another git held a lock: the one failure worth retrying."""
        text = self.stderr.lower()
        return any(needle in text for needle in LOCK_MESSAGES)


@dataclass(frozen=True, slots=True)
class GitPlace:
    """Where a command acts, named in full: the git dir, and the work tree if there is one.
    A linked worktree's admin dir (`<common>/worktrees/<name>`) also gets the common dir
    (GIT_COMMON_DIR), so its `commondir` file, which the job can write, is not read."""

    git_dir: str
    work_tree: str | None = None
    common_dir: str | None = None

    def options(self) -> list[str]:
        found = [f"--git-dir={self.git_dir}"]
        if self.work_tree is not None:
            found.append(f"--work-tree={self.work_tree}")
        return found

    def variables(self) -> dict[str, str]:
        return {} if self.common_dir is None else {"GIT_COMMON_DIR": self.common_dir}


def repository(common_dir: str) -> GitPlace:
    """The repository itself (refs, objects, the worktree list), with no work tree."""
    return GitPlace(git_dir=common_dir)


def linked_worktree(common_dir: str, admin_dir: str, path: str) -> GitPlace:
    """A worktree the gateway made: its admin dir, the repository's common dir, its path."""
    return GitPlace(git_dir=admin_dir, work_tree=path, common_dir=common_dir)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCATION_VARIABLES
           and not k.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C",
                "GIT_ASKPASS": "", "SSH_ASKPASS": "", "GIT_PAGER": "cat", "PAGER": "cat",
                "GIT_EDITOR": "true", "GIT_OPTIONAL_LOCKS": "0"})
    if extra:
        env.update(extra)
    return env


def git(args: Sequence[str], where: GitPlace | Path | str, *,
        env: Mapping[str, str] | None = None, input_bytes: bytes | None = None,
        timeout_s: float = GIT_TIMEOUT_S, lfs: bool = False) -> bytes:
    """Run git with `args` where `where` says and return its stdout. `where` is a GitPlace,
    or the caller's own checkout (a path, discovered as `git -C` would). Raises GitError
    (non-zero exit, no git, timeout), its message naming the command and git's own words."""
    variables = git_env(env)
    if isinstance(where, GitPlace):
        location, cwd = where.options(), where.git_dir
        variables.update(where.variables())
    else:
        location, cwd = ["-C", str(where)], str(where)
    command = list(args)
    if command and command[0] in DIFF_COMMANDS:
        command[1:1] = NO_DRIVERS
    neutral: list[str] = []
    if command and command[0] not in PLUMBING:
        neutral = filters_off(location, cwd, variables, timeout_s, keep_lfs=lfs)
    argv = ["git", *HARDENING, *location, *neutral, *command]
    return _run(argv, cwd, variables, input_bytes, timeout_s, label=" ".join(args[:2]))


def filters_off(location: list[str], cwd: str, variables: dict[str, str], timeout_s: float,
                keep_lfs: bool = False) -> list[str]:
    """`-c` options that turn off every filter driver the configuration (any scope, includes
    too) defines: a filter planted by a job would run in the gateway's add or checkout,
    outside the job's process group and timeout. git-lfs's with its standard commands when
    `keep_lfs`."""
    argv = ["git", *HARDENING, *location, "config", "--null", "--name-only", "--get-regexp",
            r"^filter\..+\.(clean|smudge|process|required)$"]
    try:
        out = _run(argv, cwd, variables, None, timeout_s, label="config --get-regexp")
    except GitError as err:
        if err.stderr:  # exit 1 with nothing said: no filter is configured
            raise
        out = b""
    names = set()
    for entry in out.split(b"\0"):
        parts = entry.decode("utf-8", "surrogateescape").split(".")
        if len(parts) >= 3:
            names.add(".".join(parts[1:-1]))
    options: list[str] = []
    for name in sorted(names - ({"lfs"} if keep_lfs else set())):
        for key in FILTER_KEYS:
            options += ["-c", f"filter.{name}.{key}="]
        options += ["-c", f"filter.{name}.required=false"]
    return options + (list(LFS_FILTER) if keep_lfs else [])


def _run(argv: list[str], cwd: str, env: dict[str, str], input_bytes: bytes | None,
         timeout_s: float, label: str) -> bytes:
    """One git process in a process group of its own, the whole group killed at timeout_s:
    whatever git started (it should start nothing) goes with it."""
    try:
        child = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL)
    except FileNotFoundError as exc:
        if exc.filename == "git":
            raise GitError("git is not installed (no `git` on PATH); install git to use "
                           "isolation = \"worktree\".") from None
        raise GitError(f"`git {label}` could not run in {cwd!r}: {exc.strerror or exc}.") from None
    except OSError as exc:
        raise GitError(f"`git {label}` could not run: {exc.strerror or exc}.") from None
    try:
        stdout, stderr_bytes = child.communicate(input_bytes, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        raise GitError(f"`git {label}` did not finish within {timeout_s:g} s.") from None
    except BaseException:
        _kill_group(child)
        raise
    if child.returncode != 0:
        stderr = stderr_bytes.decode("utf-8", "replace").strip()
        raise GitError(f"`git {label}` failed (exit {child.returncode}): "
                       f"{stderr[:STDERR_SHOWN_CHARS]}", stderr)
    return stdout


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.communicate(timeout=KILLED_WAIT_S)


def git_text(args: Sequence[str], where: GitPlace | Path | str, *,
             env: Mapping[str, str] | None = None) -> str:
    """git's stdout as one stripped line of text."""
    return git(args, where, env=env).decode("utf-8", "surrogateescape").strip()
