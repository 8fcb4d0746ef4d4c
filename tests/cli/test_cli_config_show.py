"""`agent-cli-gateway config show`: the effective configuration with each value's source,
secrets redacted. The real console entry as a subprocess, a SQLite config and a PostgreSQL
config (the throwaway server's DSN, with a password added: `config show` never connects),
with a variable and a secret file on top."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from neutral.redaction import REDACTED
from tests.cli.cli_support import Cli

PASSWORD = "pw-never-shown-7f3a"
TOKEN = "tok-never-shown-91c2"
API_KEY = "sk-never-shown-55d0"


def with_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{(user or 'gateway').partition(':')[0]}:{PASSWORD}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture(params=["sqlite", "postgres"])
def shown(request: pytest.FixtureRequest, home: Path) -> tuple[Cli, Path, dict[str, str]]:
    """A config of each backend, a secret file and a variable on top; (cli, secrets dir,
    the environment to run with)."""
    secrets = home / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "http__auth_token").write_text(TOKEN + "\n")
    if request.param == "sqlite":
        persistence = f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n'
    else:
        dsn = with_password(request.getfixturevalue("postgres_dsn"))
        persistence = '[persistence]\nbackend = "postgres"\n'
        (secrets / "persistence__dsn").write_text(dsn)
    config = home / "config.toml"
    config.write_text(persistence + "[lease]\nheartbeat_s = 10\n"
                      f'[providers.claude.env]\nANTHROPIC_API_KEY = "{API_KEY}"\n')
    env = {"AGENT_GATEWAY_SECRETS_DIR": str(secrets), "AGENT_GATEWAY_LEASE__TTL_S": "40"}
    return Cli(home, config, request.param), secrets, env


def source_of(text: str, key: str) -> str:
    """The `# source` comment of the first line that sets (or leaves unset) `key`."""
    for line in text.splitlines():
        if re.match(rf"(# )?{re.escape(key)}( = | is unset)", line):
            return line.rpartition("  # ")[2]
    raise AssertionError(f"{key} not shown:\n{text}")


def test_config_show_prints_toml_with_each_value_s_source_and_no_secret(
        shown: tuple[Cli, Path, dict[str, str]]) -> None:
    cli, secrets, env = shown
    done = cli.run("config", "show", env=env)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for secret in (PASSWORD, TOKEN, API_KEY):
        assert secret not in text and secret not in done.stderr
    data = tomllib.loads(text)  # it is TOML
    assert data["lease"]["ttl_s"] == 40 and data["lease"]["heartbeat_s"] == 10
    assert data["persistence"]["backend"] == cli.backend
    assert data["http"]["auth_token"] == REDACTED
    assert data["providers"]["claude"]["env"] == {"ANTHROPIC_API_KEY": REDACTED}
    assert source_of(text, "ttl_s") == "env AGENT_GATEWAY_LEASE__TTL_S"
    assert source_of(text, "heartbeat_s") == f"file {cli.config}"
    assert source_of(text, "auth_token") == f"secret file {secrets / 'http__auth_token'}"
    assert source_of(text, "max_running_jobs") == "default"
    if cli.backend == "postgres":
        assert data["persistence"]["dsn"] == REDACTED
        assert source_of(text, "dsn") == f"secret file {secrets / 'persistence__dsn'}"
    else:
        assert "dsn" not in data["persistence"]  # unset: a comment, TOML has no null
        assert source_of(text, "dsn") == "default"
        assert data["persistence"]["path"] == str(cli.home / "state" / "jobs.db")


def test_config_show_json_is_one_object_per_key(shown: tuple[Cli, Path, dict[str, str]]) -> None:
    cli, secrets, env = shown
    done = cli.run("config", "show", "--json", env=env)
    assert done.returncode == 0, done.stderr
    for secret in (PASSWORD, TOKEN, API_KEY):
        assert secret not in done.stdout
    entries = {entry["key"]: entry for entry in json.loads(done.stdout)}
    assert entries["lease.ttl_s"] == {"key": "lease.ttl_s", "value": 40.0,
                                      "source": "env AGENT_GATEWAY_LEASE__TTL_S"}
    assert entries["providers.claude.env.ANTHROPIC_API_KEY"]["value"] == REDACTED
    assert entries["persistence.pool_max"] == {"key": "persistence.pool_max", "value": None,
                                               "source": "default"}
    expected_dsn = (REDACTED, f"secret file {secrets / 'persistence__dsn'}") \
        if cli.backend == "postgres" else (None, "default")
    assert (entries["persistence.dsn"]["value"],
            entries["persistence.dsn"]["source"]) == expected_dsn


def test_config_show_of_a_bad_config_names_the_variable_and_exits_2(sqlite_cli: Cli) -> None:
    done = sqlite_cli.run("config", "show", env={"AGENT_GATEWAY_LEASE__TTL_S": "soon"})
    assert done.returncode == 2 and done.stdout == ""
    assert "AGENT_GATEWAY_LEASE__TTL_S" in done.stderr and "Traceback" not in done.stderr
