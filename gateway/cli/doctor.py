"""`agent-cli-gateway doctor`: what is configured, what is reachable, what is installed.

Each check returns a `Check`; `cmd_doctor` renders them as text or JSON. A broken config, an
unreadable store or no usable provider at all fail the run ("not ready"); a missing provider
CLI is a warning (the other providers still work) that says how to install it.

Nothing here writes: the store is inspected read-only (gateway/store/inspect.py: a SQLite
file is opened read-only if it exists, PostgreSQL in a read-only session), never created
nor migrated; the report says what `serve` would do instead. A CLI is looked for twice: with
this shell's PATH, and with the minimal PATH an MCP client gives the servers it starts
(plus the user bin dirs the gateway adds), since the latter is the one that counts. The one
thing doctor makes is a probe directory, removed at once, beside where a SQLite store that
does not exist yet would be created: proof that it could be.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from gateway import __version__, platform
from gateway.childenv import secret_env_names
from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from gateway.cli.version import PROG
from gateway.config import (
    PROVIDER_NAMES,
    ConfigError,
    ProviderConfig,
    Settings,
    default_config_path,
    load_settings,
    unknown_env_warnings,
)
from gateway.fs import uncreatable
from gateway.logs import configure_logging
from gateway.store import POSTGRES_DRIVER_MISSING
from gateway.store.base import SCHEMA_VERSION
from gateway.store.postgres import driver_missing
from neutral.redaction import redact_text
from providers.registry import CLI_PROVIDERS, provider_binary

STORE_PROBE_TIMEOUT_S = 10.0  # a database that does not answer is "unreachable", not a hang
# What MCP clients (Claude Desktop, editors launched from a desktop) typically give a server
# they start: the system dirs only, none of a login shell's additions.
MINIMAL_CLIENT_PATH = os.pathsep.join(("/usr/bin", "/bin", "/usr/sbin", "/sbin"))

Status = Literal["ok", "warning", "error", "disabled", "skipped"]


@dataclass(slots=True)
class Check:
    """One line of the report. `status == "error"` makes doctor exit non-zero."""

    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Report:
    version: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(check.status != "error" for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "version": self.version, "platform": platform.describe(),
                "checks": [asdict(c) for c in self.checks]}


def run_doctor(config_path: Path | None, client_path: str = MINIMAL_CLIENT_PATH) -> Report:
    """Check the config, the store, every CLI provider and every API provider.

    `client_path`: the PATH an MCP client would start the gateway with."""
    settings, config_check = check_config(config_path)
    checks = [config_check]
    if settings is None:
        checks.append(Check("store", "skipped", "not checked: the configuration is invalid"))
    else:
        checks.append(check_store(settings))
    providers = settings.providers if settings else {n: ProviderConfig() for n in PROVIDER_NAMES}
    secret_env = secret_env_names(settings) if settings else frozenset()
    checks += check_cli_providers(providers, secret_env, client_path)
    if settings is not None:
        checks += [check_api_provider(name, settings) for name in sorted(settings.api_providers)]
        if settings.notify.desktop:
            checks.append(check_desktop_notifier())
        checks.append(check_readiness(settings, checks, client_path))
    return Report(version=__version__, checks=checks)


def check_desktop_notifier() -> Check:
    """`[notify] desktop = true` needs notify-send (Linux) or osascript (macOS) here."""
    # The sinks module: only doctor with desktop notices on loads it.
    from gateway.jobs.notify.sinks import desktop_notifier  # deferred: start-up

    found = desktop_notifier()
    if found is None:
        return Check("desktop notices", "warning",
                     "[notify] desktop is on but neither notify-send (Linux: the libnotify-bin "
                     "package) nor osascript (macOS) is on PATH: desktop notices will fail "
                     "(`agent-cli-gateway notices --failed` shows them)")
    return Check("desktop notices", "ok", f"desktop notices through {found}", {"path": found})


def check_readiness(settings: Settings, checks: list[Check],
                    client_path: str = MINIMAL_CLIENT_PATH) -> Check:
    """The verdict per context: usable from this shell, and from a desktop client that
    starts the gateway with `client_path`. An error only when neither can take a request
    ("Ready" would be a lie); a warning, with what to put in the client's config, when only
    this shell can (`run` works here, a desktop client would find no CLI)."""
    api = [c.name for c in checks if c.name in settings.api_providers and c.status == "ok"]
    cli = [c for c in checks if c.name in PROVIDER_NAMES]
    shell = sorted([c.name for c in cli if "shell" in c.details.get("usable_from", ())] + api)
    client = sorted([c.name for c in cli if "client" in c.details.get("usable_from", ())] + api)
    details: dict[str, Any] = {"usable": shell, "usable_from_shell": shell,
                               "usable_from_client": client, "client_path": client_path}
    if not shell and not client:
        return Check("providers", "error",
                     "no provider is usable: install and log in to one of the CLIs above, or "
                     "configure an [api_providers.<name>] with its key", details)
    if set(shell) <= set(client):
        return Check("providers", "ok", f"usable: {', '.join(client)}", details)
    details.update(client_config(cli, client_path))
    only_here = [name for name in shell if name not in client]
    return Check("providers", "warning" if not client else "ok",
                 f"usable from this shell: {', '.join(shell)}; from a desktop client: "
                 f"{', '.join(client) or 'none'} ({', '.join(only_here)}: this shell's PATH "
                 f"only)", details)


def client_config(cli_checks: list[Check], client_path: str) -> dict[str, Any]:
    """What a desktop client's server entry needs so that the CLIs only this shell finds
    are found there too: `env.PATH` with their directories first, and the absolute path of
    the launcher (`uv`/`uvx`) as `command` when the minimal PATH lacks it too."""
    client_dirs = client_path.split(os.pathsep)
    missed: list[str] = []
    for check in cli_checks:
        directory = check.details.get("missed_by_client_path")
        if directory and directory not in missed:
            missed.append(directory)
    advice: dict[str, Any] = {"client_env_path": os.pathsep.join([*missed, *client_dirs])}
    for launcher in ("uv", "uvx"):
        found = shutil.which(launcher)
        if found and os.path.dirname(found) not in client_dirs:
            advice[f"client_{launcher}_command"] = found
    return advice


# -- config ------------------------------------------------------------------------------


def check_config(config_path: Path | None) -> tuple[Settings | None, Check]:
    path = config_path or default_config_path()
    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        return None, Check("config", "error", f"invalid: {exc.where}",
                           {"path": str(path), "problems": exc.problems,
                            "env_names": exc.env_names})
    ignored = unknown_env_warnings(os.environ)
    if ignored:  # what every other command warns of: a typo leaves a setting unset
        return settings, Check("config", "warning", "; ".join(ignored),
                               {"path": str(path), "exists": path.exists(),
                                "ignored_variables": ignored})
    if not path.exists():
        return settings, Check("config", "ok", f"no file at {path}: using the defaults",
                               {"path": str(path), "exists": False})
    details: dict[str, Any] = {"path": str(path), "exists": True}
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        details["mode"] = oct(mode)
        return settings, Check(
            "config", "warning",
            f"{path} is readable by other users (mode {oct(mode)}); it may hold tokens: "
            f"chmod 600 {path}", details)
    return settings, Check("config", "ok", str(path), details)


# -- store -------------------------------------------------------------------------------


def store_location(settings: Settings) -> str:
    """Where the store is, fit to print: a DSN's password is masked."""
    persistence = settings.persistence
    if persistence.backend == "sqlite":
        return str(persistence.path)
    if persistence.backend == "postgres":
        return redact_text(persistence.dsn or "")
    return "in memory"


def check_store(settings: Settings) -> Check:
    """The store's schema version, read without writing (see gateway/store/inspect.py)."""
    # Loads sqlite3: only doctor's store check pays for it.
    from gateway.store.inspect import inspect_schema  # deferred: start-up

    backend = settings.persistence.backend
    where = store_location(settings)
    details: dict[str, Any] = {"backend": backend, "location": where}
    if backend == "memory":
        return Check("store", "ok", "memory: jobs are lost when the gateway exits", details)
    if backend == "postgres" and driver_missing():
        return Check("store", "error", POSTGRES_DRIVER_MISSING, details)

    async def inspect() -> Any:
        with anyio.fail_after(STORE_PROBE_TIMEOUT_S):
            return await inspect_schema(settings)

    try:
        state = anyio.run(inspect)
    except TimeoutError:
        return Check("store", "error",
                     f"{backend} {where} did not answer within {STORE_PROBE_TIMEOUT_S:g} s",
                     details)
    except Exception as exc:
        reason = redact_text(str(exc) or type(exc).__name__)
        return Check("store", "error", f"{backend} {where} is unreachable: {reason}", details)
    details["schema_version"] = state.version
    details["serve_would"] = state.what_serve_does()
    if state.connections is not None:
        details["connections"] = state.connections
    if not state.exists:
        details["exists"] = False
        problem = uncreatable(settings.persistence.path)
        if problem is not None:
            return Check("store", "error",
                         f"sqlite {where} cannot be created ({problem}); set [persistence] "
                         f"path to a writable location", details)
        return Check("store", "ok", f"{backend} {where} (not created yet: "
                                    f"{state.what_serve_does()})", details)
    if state.version is None:
        return Check("store", "ok", f"{backend} {where}, no schema yet "
                                    f"({state.what_serve_does()})", details)
    if state.version > SCHEMA_VERSION:
        return Check("store", "error", f"{backend} {where}, schema version {state.version}: "
                                       f"{state.what_serve_does()}", details)
    summary = f"{backend} {where}, schema version {state.version}"
    if state.connections is not None:
        summary += connections_summary(settings, state.connections)
    if not state.current:
        return Check("store", "warning", f"{summary} ({state.what_serve_does()})", details)
    return Check("store", "ok", summary, details)


def connections_summary(settings: Settings, connections: dict[str, int]) -> str:
    """PostgreSQL: the server's connections against the gateways' budget (#29)."""
    persistence = settings.persistence
    return (f"; gateways hold {connections['gateway_connections']} of the server's "
            f"{connections['client_connections']} client connections (max_connections "
            f"{connections['max_connections']}); each gateway's budget: pool_max "
            f"{persistence.pool_max_for('stdio')} (stdio) / {persistence.pool_max_for('http')} "
            f"(http) + 1 for its heartbeat, pooler {persistence.pooler}")


# -- CLI providers -----------------------------------------------------------------------


def check_cli_providers(providers: dict[str, ProviderConfig],
                        secret_env: frozenset[str],
                        client_path: str = MINIMAL_CLIENT_PATH) -> list[Check]:
    """One check per CLI provider: found where (the client's PATH + user bin dirs, and
    this shell's), which version, logged in? (probed with a provider run's environment:
    without `secret_env`)."""
    checks: dict[str, Check] = {}
    found: dict[str, str] = {}
    for name in PROVIDER_NAMES:
        config = providers.get(name, ProviderConfig())
        adapter = CLI_PROVIDERS.get(name)
        if adapter is None:
            checks[name] = Check(name, "error", "no adapter for this provider in this build")
            continue
        wanted = config.command or " or ".join(adapter.commands)
        details: dict[str, Any] = {"command": wanted, "install_hint": adapter.install_hint}
        if not config.enabled:
            checks[name] = Check(name, "disabled", f"disabled in the config ({wanted})", details)
            continue
        resolved = provider_binary(name, config.command, client_path)
        in_shell = provider_binary(name, config.command, os.environ.get("PATH", ""))
        if resolved is None and in_shell is None:
            checks[name] = Check(
                name, "warning",
                f"'{wanted}' not found on PATH or in the user bin dirs; install: "
                f"{adapter.install_hint} (or set [providers.{name}].command to its path)",
                details)
            continue
        details["path"] = found[name] = resolved or str(in_shell)
        details["found_from"] = [context for context, path in
                                 (("shell", in_shell), ("client", resolved)) if path]
        checks[name] = Check(name, "ok", found[name], details)

    for name, (version, problem) in anyio.run(_probe_versions, found, secret_env).items():
        check = checks[name]
        check.details["version"] = version
        if version is not None:
            check.summary = f"{check.summary} ({version})"
        else:
            check.status = "warning"
            check.summary = f"{check.summary}: {problem}"
            check.details["version_error"] = problem
    for name, finding in anyio.run(_check_logins, found, providers, secret_env).items():
        check = checks[name]
        check.details["logged_in"] = finding.logged_in
        check.details["login_check"] = finding.how
        check.summary = f"{check.summary}; logged in: {finding.logged_in} ({finding.how})"
        if finding.logged_in == "no" and check.status == "ok":
            check.status = "warning"
            check.summary += f"; log in: {CLI_PROVIDERS[name].login_hint}"
    for name in found:
        check = checks[name]
        works = check.status == "ok"
        check.details["usable_from"] = check.details["found_from"] if works else []
        if "client" not in check.details["found_from"]:
            _only_on_this_shells_path(check, client_path)
    return [checks[name] for name in PROVIDER_NAMES if name in checks]


def _only_on_this_shells_path(check: Check, client_path: str) -> None:
    """A CLI that `run` finds here but a desktop client would not: a warning that says
    where it is and what the gateway's config (or the client's `env`) needs."""
    path = check.details["path"]
    directory = os.path.dirname(path)
    check.details["missed_by_client_path"] = directory
    check.status = "warning"
    check.details["client_path"] = client_path
    check.summary += (f"; on this shell's PATH only, not a desktop client's: set "
                      f"[providers.{check.name}].command = \"{path}\" or the client's "
                      f"env PATH below")


async def _check_logins(found: dict[str, str], providers: dict[str, ProviderConfig],
                        secret_env: frozenset[str]) -> dict[str, Any]:
    """Every found CLI's login state at once (status commands run in threads, bounded)."""
    from gateway.cli.doctor_auth import check_login  # deferred: start-up (only doctor checks logins)

    results: dict[str, Any] = {}

    async def one(name: str, path: str) -> None:
        config = providers.get(name, ProviderConfig())
        results[name] = await anyio.to_thread.run_sync(check_login, name, path, config,
                                                       secret_env)

    async with anyio.create_task_group() as group:
        for name, path in found.items():
            group.start_soon(one, name, path)
    return results


async def _probe_versions(found: dict[str, str], secret_env: frozenset[str],
                          ) -> dict[str, tuple[str | None, str | None]]:
    """`<cli> --version` for every found CLI at once; each probe is bounded and killed
    (with its process group) when it overruns, so a hung CLI cannot hang doctor."""
    from gateway.versions import probe_version  # deferred: start-up (only doctor probes versions)

    results: dict[str, tuple[str | None, str | None]] = {}

    async def one(name: str, path: str) -> None:
        results[name] = await probe_version(path, secret_env)

    async with anyio.create_task_group() as group:
        for name, path in found.items():
            group.start_soon(one, name, path)
    return results


# -- API providers -----------------------------------------------------------------------


def check_api_provider(name: str, settings: Settings) -> Check:
    """Configured HTTP API: is its key's env var set here? (the value is never shown)."""
    api = settings.api_providers[name]
    details: dict[str, Any] = {"kind": api.kind, "base_url": redact_text(api.base_url),
                               "api_key_env": api.api_key_env}
    where = f"{api.kind} {details['base_url']}"
    if api.api_key_env is None:
        return Check(name, "ok", f"{where}, no API key configured", details)
    details["api_key_set"] = bool(os.environ.get(api.api_key_env))
    if details["api_key_set"]:
        return Check(name, "ok", f"{where}, key from ${api.api_key_env}", details)
    return Check(
        name, "warning",
        f"{where}: ${api.api_key_env} is not set in this environment (MCP clients pass few env "
        f"vars: set it in the client's server `env` block)", details)


def _print_contexts(details: dict[str, Any]) -> None:
    """One line per context a gateway is started from, and the client-config lines that
    make the second one work like the first."""
    shell, client = details["usable_from_shell"], details["usable_from_client"]
    print(f"From this shell: {', '.join(shell) if shell else 'no provider is usable'}.")
    print(f"From a desktop client (PATH {details['client_path']} and the user bin dirs): "
          f"{', '.join(client) if client else 'no provider is usable'}.")
    if "client_env_path" not in details:
        return
    print("  In the client's server entry for the gateway, set:")
    for launcher in ("uv", "uvx"):
        if f"client_{launcher}_command" in details:
            print(f'    "command": "{details[f"client_{launcher}_command"]}"   '
                  f"(if it starts `{launcher}`)")
    print(f'    "env": {{"PATH": "{details["client_env_path"]}"}}   '
          f'(Codex: env = {{ PATH = "{details["client_env_path"]}" }})')
    print("  or give each CLI's absolute path as [providers.<name>] command in the gateway's "
          "config.")


def summarize(checks: Iterable[Check]) -> tuple[int, int]:
    """(errors, warnings)."""
    checks = list(checks)
    return (sum(c.status == "error" for c in checks), sum(c.status == "warning" for c in checks))


# -- rendering ---------------------------------------------------------------------------

_MARKS = {"ok": "ok", "warning": "WARN", "error": "FAIL", "disabled": "off", "skipped": "skip"}


def add_parsers(tree: CommandTree) -> None:
    """`doctor [--json]`."""
    doctor = tree.add(
        "doctor", help="check the config, the store and the providers",
        description="Check the config, the store (read-only: never creates or migrates it), "
                    "each provider CLI (found under an MCP client's PATH? version? logged "
                    "in?) and each API provider. Exit 1 when not ready.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    configure_logging("debug" if args.debug else "warning", "auto")
    report = run_doctor(args.config)
    config_broken = any(c.name == "config" and c.status == "error" for c in report.checks)
    # Same codes as every other command: 2 for a bad config, 1 for anything else broken.
    code = EXIT_USAGE if config_broken else EXIT_OK if report.ok else EXIT_FAILURE
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return code
    print(f"{PROG} {report.version}")
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        print(f"  {_MARKS[check.status]:<4}  {check.name:<{width}}  {check.summary}")
        for problem in check.details.get("problems", []):
            print(f"        {'':<{width}}  - {problem}")
    errors, warnings = summarize(report.checks)
    verdict = next((c for c in report.checks if c.name == "providers"), None)
    if verdict is not None and verdict.status != "error":
        _print_contexts(verdict.details)
    if errors:
        print(f"Not ready: {errors} problem(s) to fix, {warnings} warning(s).")
    elif verdict is not None and not verdict.details.get("usable_from_client"):
        print(f"Ready from this shell, not from a desktop client ({warnings} warning(s)).")
    else:
        print(f"Ready ({warnings} warning(s)).")
    sys.stdout.flush()
    return code
