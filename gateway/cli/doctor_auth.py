"""What `doctor` can learn about a CLI's login without spending anything.

Per CLI, in this order: its own offline status command where it has one (`codex login
status` reads ~/.codex/auth.json; `cursor-agent status` shows the stored login), then the
credential file it keeps, then an API-key variable the gateway would pass it (the config's
`[providers.<name>] env`, or this environment). What to look at is the adapter's
`login_check` (providers/base.py `LoginCheck`), a fact of the provider beside its argv;
this module only looks. Each answer is "yes", "no" or "cannot tell" (a login kept in the
macOS keychain, a CLI without a status command): never a guess, and never a model call. A
status command is bounded and killed with its process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway import platform
from gateway.childenv import child_env
from gateway.config import ProviderConfig
from providers.registry import CLI_PROVIDERS

STATUS_TIMEOUT_S = 10.0  # a status command reads a file; one that hangs is killed
STATUS_OUTPUT_CHARS = 160  # what of its answer the report quotes

LoggedIn = Literal["yes", "no", "cannot tell"]


@dataclass(frozen=True, slots=True)
class AuthFinding:
    logged_in: LoggedIn
    how: str  # what was looked at, fit to print (never a secret value)


def check_login(name: str, executable: str, config: ProviderConfig,
                secret_env: frozenset[str] = frozenset()) -> AuthFinding:
    """The login state of CLI `name` found at `executable` (see the module doc). A status
    command gets a provider run's environment: without the gateway's secrets
    (`secret_env`), with the provider's configured env. Raises KeyError for a name that
    is no CLI provider."""
    spec = CLI_PROVIDERS[name].login_check
    if spec.status_argv:
        env = child_env(secret_env, config.env)
        finding = _status_command(executable, spec.status_argv, spec.status_exit_1_is_no, env)
        if finding.logged_in != "cannot tell":
            return finding
    for pattern in spec.files:
        path = _expand(pattern)
        if path is not None and path.is_file():
            return AuthFinding("yes", f"credentials file {path} exists")
    for key in spec.env_keys:
        if config.env.get(key):
            return AuthFinding("yes", f"{key} is set in [providers.{name}] env")
        if os.environ.get(key):
            return AuthFinding("yes", f"{key} is set in this environment (an MCP client "
                                      f"must pass it too, in its server `env`)")
    looked = [f"`{Path(executable).name} {' '.join(spec.status_argv)}`"] if spec.status_argv else []
    looked += [p for p in spec.files]
    if not looked and not spec.env_keys:
        return AuthFinding("cannot tell", "this CLI has no offline login check")
    if platform.logins_in_keychain() and spec.in_macos_keychain:
        return AuthFinding("cannot tell", "on macOS the login is kept in the keychain")
    what = ", ".join(looked + [f"${k}" for k in spec.env_keys])
    if spec.files or spec.status_argv:
        return AuthFinding("no", f"no login found ({what})")
    return AuthFinding("cannot tell", f"no API key set ({what}); a login of its own "
                                      f"cannot be seen from outside")


def _expand(pattern: str) -> Path | None:
    if pattern.startswith("$CODEX_HOME"):
        base = os.environ.get("CODEX_HOME")
        return Path(base) / pattern.split("/", 1)[1] if base else None
    return Path(pattern).expanduser()


def _status_command(executable: str, argv: tuple[str, ...], exit_1_is_no: bool,
                    env: dict[str, str]) -> AuthFinding:
    command = f"`{Path(executable).name} {' '.join(argv)}`"
    try:
        child = subprocess.Popen([executable, *argv], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, env=env)
    except OSError as exc:
        return AuthFinding("cannot tell", f"{command} cannot run: {exc.strerror or exc}")
    try:
        stdout, stderr = child.communicate(timeout=STATUS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return AuthFinding("cannot tell", f"{command} did not answer within "
                                          f"{STATUS_TIMEOUT_S:g} s")
    said = (stdout or stderr).decode("utf-8", "replace").strip().splitlines()
    quote = said[0][:STATUS_OUTPUT_CHARS] if said else "no output"
    if child.returncode == 0 and "not logged in" not in quote.lower():
        return AuthFinding("yes", f"{command}: {quote}")
    if child.returncode == 1 and exit_1_is_no:
        return AuthFinding("no", f"{command}: {quote}")
    return AuthFinding("cannot tell", f"{command} exited {child.returncode}: {quote}")
