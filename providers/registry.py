"""The seven CLI adapters by name, and where their binaries are.

MCP clients often start the gateway with a bare PATH (Claude Desktop on macOS passes
`/usr/bin:/bin:/usr/sbin:/sbin`), while the CLIs live in user bin directories. Commands are
therefore looked up on `extended_path`, which the runner also gives the child process.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from providers.base import CliProvider
from providers.claude import ClaudeProvider
from providers.codex import CodexProvider
from providers.cursor import CursorProvider
from providers.devin import DevinProvider
from providers.gemini import GeminiProvider
from providers.grok import GrokProvider
from providers.mistral import MistralProvider
from providers.safety import check_argv_size

__all__ = ["CLI_PROVIDERS", "REPORTS_COST", "USER_BIN_DIRS", "check_argv_size",
           "extended_path", "missing_command", "provider_binary", "user_bin_dirs"]

# The one list of CLI providers: the config's `[providers.<name>]` sections, doctor's
# checks and the MCP tools all follow it (gateway/config PROVIDER_NAMES is its keys).
CLI_PROVIDERS: dict[str, CliProvider] = {
    provider.name: provider
    for provider in (ClaudeProvider(), CodexProvider(), GeminiProvider(), GrokProvider(),
                     MistralProvider(), DevinProvider(), CursorProvider())
}
# The CLIs that print what a run cost (`CliProvider.reports_cost`): only these count against
# a money budget and take a cost cap; an HTTP API's name is never in it.
REPORTS_COST = frozenset(name for name, provider in CLI_PROVIDERS.items()
                         if provider.reports_cost)

# Where CLIs installed for the user live (npm -g, nvm, bun, pipx/uv tool, Homebrew), in the
# order they are searched after the given PATH. A `*` component picks up every installed
# node version (the one pattern form user_bin_dirs() understands). Every lookup takes the
# list as a parameter: tests pass their own, so the host's installed CLIs never count.
USER_BIN_DIRS = (
    "~/.local/bin",
    "/opt/homebrew/bin",
    "/usr/local/bin",
    "~/.npm-global/bin",
    "~/.nvm/versions/node/*/bin",
    "~/.bun/bin",
)


def extended_path(path: str, bin_dirs: Sequence[str] = USER_BIN_DIRS) -> str:
    """`path` followed by the `bin_dirs` that exist, each directory once.

    `~` is expanded at call time (so a test's HOME counts); newer nvm node versions come
    first. An empty `path` falls back to the system default search path.
    """
    entries = [p for p in (path or os.defpath).split(os.pathsep) if p]
    entries.extend(user_bin_dirs(bin_dirs))
    return os.pathsep.join(dict.fromkeys(entries))


@dataclass(frozen=True, slots=True)
class _BinDirs:
    """The user bin dirs found, and what decided that: each path looked at (a candidate
    dir, or the dir a `*` was matched in) with its mtime then (None: missing)."""

    found: tuple[str, ...]
    seen: tuple[tuple[str, int | None], ...]

    def still_valid(self) -> bool:
        return all(_mtime_ns(directory) == mtime for directory, mtime in self.seen)


# By home directory and patterns. Read and filled from the event loop (and any thread): a dict
# lookup and store are atomic, and two threads that both rescan store equal answers.
_bin_dirs: dict[tuple[str, tuple[str, ...]], _BinDirs] = {}


def user_bin_dirs(patterns: Sequence[str] = USER_BIN_DIRS) -> tuple[str, ...]:
    """The `patterns` (USER_BIN_DIRS) that exist, in search order (glob matches newest
    name first).

    Every request and every spawn asks (bench/README.md, async admission), so the answer is
    kept and re-used while nothing it was read from has changed: a user bin dir that appears
    or goes, or a new entry where a `*` matches, changes a watched mtime, so a CLI installed
    into a new user bin dir (or a new nvm node version) while the gateway runs is found on
    the next request. A CLI added to a dir already listed needs nothing: shutil.which looks.
    """
    key = (os.path.expanduser("~"), tuple(patterns))
    cached = _bin_dirs.get(key)
    if cached is not None and cached.still_valid():
        return cached.found
    fresh = _scan_user_bin_dirs(key[1])
    _bin_dirs[key] = fresh
    return fresh.found


def _scan_user_bin_dirs(patterns: tuple[str, ...]) -> _BinDirs:
    found: list[str] = []
    seen: list[tuple[str, int | None]] = []

    def look_into(directory: str) -> None:
        # The mtime first: a change made while we look makes the next call look again.
        seen.append((directory, _mtime_ns(directory)))

    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        base, wildcard, tail = expanded.partition(f"{os.sep}*{os.sep}")
        if not wildcard:
            look_into(expanded)
            if os.path.isdir(expanded):
                found.append(expanded)
            continue
        # One `*` component, like glob (hidden names skipped): the entries of `base` and
        # each candidate decide what matches.
        look_into(base)
        try:
            names = [n for n in os.listdir(base) if not n.startswith(".")]
        except OSError:
            names = []
        matches = []
        for name in names:
            candidate = os.path.join(base, name, tail)
            look_into(candidate)
            if os.path.isdir(candidate):
                matches.append(candidate)
        found.extend(sorted(matches, reverse=True))
    return _BinDirs(found=tuple(dict.fromkeys(found)), seen=tuple(seen))


def _mtime_ns(directory: str) -> int | None:
    try:
        return os.stat(directory).st_mtime_ns
    except OSError:
        return None


def _executable(path: str) -> str | None:
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def provider_binary(provider: str | CliProvider, configured_command: str | None,
                    search_path: str, bin_dirs: Sequence[str] = USER_BIN_DIRS) -> str | None:
    """The absolute path of the binary to run for `provider`, or None if there is none.

    A configured command wins: a path (absolute, `~/...` or relative, containing '/') must
    be an executable file; a bare name is searched on the extended PATH. Without one, the
    provider's own commands are tried in order (gemini: `agy`, then `gemini`). The extended
    PATH is `search_path` then `bin_dirs` (extended_path).
    Raises KeyError for an unknown provider name.
    """
    adapter = CLI_PROVIDERS[provider] if isinstance(provider, str) else provider
    search = extended_path(search_path, bin_dirs)
    if configured_command:
        command = os.path.expanduser(configured_command)
        if os.sep in command:
            return _executable(os.path.abspath(command))
        return shutil.which(command, path=search)
    for command in adapter.commands:
        found = shutil.which(command, path=search)
        if found:
            return found
    return None


def missing_command(provider: str, configured_command: str | None, search_path: str) -> str:
    """Why `provider_binary` found nothing, and what to do, for a user to act on.

    A configured path is reported as that path (it does not exist, or is not an executable
    file): "install it from npm" would be wrong advice for a typo in the config. A name is
    reported with the directories searched, since an MCP client's PATH is often not the
    user's shell PATH.
    """
    adapter = CLI_PROVIDERS[provider]
    setting = f"[providers.{provider}] command"
    if configured_command:
        command = os.path.expanduser(configured_command)
        if os.sep in command:
            path = os.path.abspath(command)
            problem = ("is not an executable file" if os.path.exists(path)
                       else "does not exist")
            return (f"The configured command {configured_command!r} ({setting}) {problem}: "
                    f"{path}. Fix {setting} to the CLI's full path, or remove it to search "
                    f"PATH.")
        names = f"'{configured_command}'"
    else:
        names = " or ".join(f"'{c}'" for c in adapter.commands)
    searched = extended_path(search_path).split(os.pathsep)
    return (f"The {provider} CLI ({names}) was not found; searched: {', '.join(searched)}. "
            f"Install it ({adapter.install_hint}) or set {setting} to its full path.")
