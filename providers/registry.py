"""The seven CLI adapters by name, and where their binaries are.

MCP clients often start the gateway with a bare PATH (Claude Desktop on macOS passes
`/usr/bin:/bin:/usr/sbin:/sbin`), while the CLIs live in user bin directories. Commands are
therefore looked up on `extended_path`, which the runner also gives the child process.
"""

from __future__ import annotations

import glob
import os
import shutil

from providers.base import CliProvider
from providers.claude import ClaudeProvider
from providers.codex import CodexProvider
from providers.cursor import CursorProvider
from providers.devin import DevinProvider
from providers.gemini import GeminiProvider
from providers.grok import GrokProvider
from providers.mistral import MistralProvider
from providers.safety import check_argv_size

__all__ = ["CLI_PROVIDERS", "USER_BIN_DIRS", "check_argv_size", "extended_path",
           "resolve_command"]

CLI_PROVIDERS: dict[str, CliProvider] = {
    provider.name: provider
    for provider in (ClaudeProvider(), CodexProvider(), GeminiProvider(), GrokProvider(),
                     MistralProvider(), DevinProvider(), CursorProvider())
}

# Where CLIs installed for the user live (npm -g, nvm, bun, pipx/uv tool, Homebrew), in the
# order they are searched after the given PATH. Globs pick up every installed node version.
USER_BIN_DIRS = (
    "~/.local/bin",
    "/opt/homebrew/bin",
    "/usr/local/bin",
    "~/.npm-global/bin",
    "~/.nvm/versions/node/*/bin",
    "~/.bun/bin",
)


def extended_path(path: str) -> str:
    """`path` followed by the user bin directories that exist, each directory once.

    `~` is expanded at call time (so a test's HOME counts); newer nvm node versions come
    first. An empty `path` falls back to the system default search path.
    """
    entries = [p for p in (path or os.defpath).split(os.pathsep) if p]
    for pattern in USER_BIN_DIRS:
        matches = sorted(glob.glob(os.path.expanduser(pattern)), reverse=True)
        entries.extend(m for m in matches if os.path.isdir(m))
    return os.pathsep.join(dict.fromkeys(entries))


def _executable(path: str) -> str | None:
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def resolve_command(provider: str | CliProvider, configured_command: str | None,
                    search_path: str) -> str | None:
    """The absolute path of the binary to run for `provider`, or None if there is none.

    A configured command wins: a path (absolute, `~/...` or relative, containing '/') must
    be an executable file; a bare name is searched on the extended PATH. Without one, the
    provider's own commands are tried in order (gemini: `agy`, then `gemini`).
    Raises KeyError for an unknown provider name.
    """
    adapter = CLI_PROVIDERS[provider] if isinstance(provider, str) else provider
    search = extended_path(search_path)
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
