"""Every git command the worktree code runs: an argv list, a bounded time, no prompt, no hook.

One home for how git is called, so no call can forget the hardening: hooks off (a repository's
hooks are its author's code, and a checkout or commit would run them), no fsmonitor daemon, no
submodule recursion, no terminal prompt, and the C locale so that an error's text can be read
(`lock_error`). The location variables a caller's environment may hold (`GIT_DIR`, ...) are
dropped: a command acts on the repository it names with `-C`, nothing else.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

GIT_TIMEOUT_S = 120.0  # a checkout of a large repository on a slow disk; a hung git is killed
# Configuration every call gets on its command line (stronger than any config file).
HARDENING = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
             "-c", "submodule.recurse=false", "-c", "protocol.allow=never")
# Variables that would point a command at another repository, index or object store.
LOCATION_VARIABLES = frozenset({
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_PREFIX", "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
})
# What git prints when another git holds a lock it needs (index.lock, config.lock, a ref's).
LOCK_MESSAGES = ("could not lock", ".lock': file exists", "unable to create '",
                 "cannot lock ref", "is locked")
STDERR_SHOWN_CHARS = 600  # of git's complaint, in an error message


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


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCATION_VARIABLES}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C",
                "GIT_ASKPASS": "", "SSH_ASKPASS": ""})
    if extra:
        env.update(extra)
    return env


def git(args: Sequence[str], cwd: Path | str, *, env: Mapping[str, str] | None = None,
        input_bytes: bytes | None = None, timeout_s: float = GIT_TIMEOUT_S) -> bytes:
    """Run `git -C cwd <args>` and return its stdout. Raises GitError (non-zero exit, no git,
    timeout), its message naming the command and git's own words."""
    argv = ["git", *HARDENING, "-C", str(cwd), *args]
    try:
        done = subprocess.run(argv, input=input_bytes, capture_output=True, env=git_env(env),
                              timeout=timeout_s, check=False,
                              stdin=None if input_bytes is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise GitError("git is not installed (no `git` on PATH); install git to use "
                       "isolation = \"worktree\".") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"`git {args[0]}` did not finish within {timeout_s:g} s.") from None
    except OSError as exc:
        raise GitError(f"`git {args[0]}` could not run: {exc.strerror or exc}.") from None
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"`git {' '.join(args[:2])}` failed (exit {done.returncode}): "
                       f"{stderr[:STDERR_SHOWN_CHARS]}", stderr)
    return done.stdout


def git_text(args: Sequence[str], cwd: Path | str, *,
             env: Mapping[str, str] | None = None) -> str:
    """git's stdout as one stripped line of text."""
    return git(args, cwd, env=env).decode("utf-8", "surrogateescape").strip()
