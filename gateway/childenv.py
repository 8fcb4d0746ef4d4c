"""The environment of every process the gateway starts: provider runs and `--version` probes.

A provider CLI runs tools on prompts the gateway cannot vet, so it must not inherit what the
gateway holds in its own environment: its settings (`AGENT_GATEWAY_*`: the HTTP bearer token,
the PostgreSQL DSN with its password), the API keys its HTTP providers read (the variables
named by `[api_providers.*] api_key_env`) and the PostgreSQL client's password variables.
A provider that needs one of those names gets it only by naming it in its own
`[providers.<name>] env`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from gateway.config import ENV_PREFIX, Settings
from providers.registry import extended_path

# What libpq-style clients (asyncpg included) read a PostgreSQL password from.
POSTGRES_SECRET_ENV = ("PGPASSWORD", "PGPASSFILE")


def secret_env_names(settings: Settings) -> frozenset[str]:
    """The variables holding secrets of this configuration, besides `AGENT_GATEWAY_*`."""
    keys = {api.api_key_env for api in settings.api_providers.values() if api.api_key_env}
    return frozenset(keys | set(POSTGRES_SECRET_ENV))


def child_env(secret_names: Iterable[str], extra: Mapping[str, str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: `base` (default: this process's) without the gateway's
    secrets (`AGENT_GATEWAY_*`, PostgreSQL passwords and `secret_names`), with plain output
    (NO_COLOR, TERM=dumb: no ANSI escapes or pagers in output we parse and store), then
    `extra` on top, and PATH extended with the user bin dirs (MCP clients often pass a bare
    PATH; providers/registry.py). Blocking: the user bin dirs are scanned (call it off the
    event loop when it matters)."""
    source = os.environ if base is None else base
    hidden = set(secret_names) | set(POSTGRES_SECRET_ENV)
    env = {k: v for k, v in source.items()
           if not k.upper().startswith(ENV_PREFIX) and k not in hidden}
    env["NO_COLOR"] = "1"
    env["TERM"] = "dumb"
    extra = extra or {}
    env.update({k: v for k, v in extra.items() if k != "PATH"})
    env["PATH"] = extended_path(extra.get("PATH", source.get("PATH", "")))
    return env
