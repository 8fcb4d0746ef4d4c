"""The real console entry (`python -m gateway ...`) as a subprocess, with HOME in tmp."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

import pytest

from gateway import __version__
from gateway.cli.common import command as hinted_command
from gateway.config import Settings, load_settings
from tests.waiting import scaled

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = scaled(60)  # a cold interpreter on a busy 2-core box; a hang fails instead of blocking
T = TypeVar("T")


def run_cli(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the console entry exactly as a user would, isolated from the developer's config."""
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGENT_GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env={**base, "HOME": str(home), **(env or {})},
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def config_file(home: Path, text: str) -> Path:
    path = home / "custom.toml"
    path.write_text(text)
    return path


# -- --version and init ------------------------------------------------------------------


def test_version_prints_the_package_version(home: Path) -> None:
    done = run_cli(home, "--version")
    assert done.returncode == 0
    assert done.stdout == f"agent-cli-gateway {__version__}\n"


def test_help_lists_every_command(home: Path) -> None:
    done = run_cli(home, "--help")
    assert done.returncode == 0
    for command in ("serve", "init", "doctor", "run", "instances", "jobs"):
        assert command in done.stdout


def test_init_writes_the_example_config_owner_only(home: Path) -> None:
    done = run_cli(home, "init")
    assert done.returncode == 0, done.stderr
    path = home / ".agent-cli-gateway" / "config.toml"
    assert str(path) in done.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == (REPO / "config.example.toml").read_text()


def test_the_written_config_loads_to_the_defaults(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli(home, "init").returncode == 0
    monkeypatch.setenv("HOME", str(home))
    written = load_settings(home / ".agent-cli-gateway" / "config.toml")
    assert written.model_dump() == Settings().model_dump()


def test_init_refuses_to_overwrite_an_existing_config(home: Path) -> None:
    path = home / ".agent-cli-gateway" / "config.toml"
    path.parent.mkdir()
    path.write_text("[limits]\nmax_running_jobs = 3\n")

    done = run_cli(home, "init")
    assert done.returncode == 1
    assert "already exists" in done.stderr and "--force" in done.stderr
    assert "Traceback" not in done.stderr
    assert path.read_text() == "[limits]\nmax_running_jobs = 3\n"


def test_init_force_replaces_the_file_and_makes_it_owner_only(home: Path) -> None:
    path = home / ".agent-cli-gateway" / "config.toml"
    path.parent.mkdir()
    path.write_text("[limits]\nmax_running_jobs = 3\n")
    path.chmod(0o644)

    done = run_cli(home, "init", "--force")
    assert done.returncode == 0, done.stderr
    assert path.read_text() == (REPO / "config.example.toml").read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temp file left


def test_init_writes_where_config_or_agent_gateway_config_points(home: Path) -> None:
    explicit = home / "a" / "b" / "gw.toml"
    assert run_cli(home, "init", "--config", str(explicit)).returncode == 0
    assert explicit.is_file()

    by_env = home / "by-env.toml"
    assert run_cli(home, "init", env={"AGENT_GATEWAY_CONFIG": str(by_env)}).returncode == 0
    assert by_env.is_file()
    assert not (home / ".agent-cli-gateway").exists()


# -- configuration errors: exit 2, one line per problem, no traceback ----------------------


BAD_CONFIGS = {
    "typo": ("[lease]\nttl = 120\n", ["unknown key 'lease.ttl'"]),
    "not-toml": ("[lease\n", ["not valid TOML"]),
    "rules": (
        "[lease]\nheartbeat_s = 60\ninstance_gc_s = 10\n[limits]\nmax_queued_jobs = -1\n",
        ["lease.ttl_s (90) must be at least 2 * lease.heartbeat_s", "lease.instance_gc_s",
         "limits.max_queued_jobs"],
    ),
    "postgres": ('[persistence]\nbackend = "postgres"\n', ["persistence.dsn is required"]),
    "provider": ("[providers.chatgpt]\n", ["unknown provider section"]),
}


# Every case through `serve` over HTTP (an operator's command; a stdio server keeps serving
# and lets every tool say what is wrong: tests/mcp/test_first_contact.py); the entry
# points that load config another way get one case each.
HTTP_SERVE = ["serve", "--transport", "http"]
CONFIG_CASES = [(HTTP_SERVE, case) for case in sorted(BAD_CONFIGS)] + [
    (["jobs", "list"], "typo"), (["jobs", "list"], "rules"),
    (["jobs", "cancel", "some-id"], "not-toml")]


@pytest.mark.parametrize(("command", "case"), CONFIG_CASES,
                         ids=[f"{' '.join(c) or 'default'}-{k}" for c, k in CONFIG_CASES])
def test_a_bad_config_exits_2_with_one_readable_line_per_problem(
    home: Path, command: list[str], case: str
) -> None:
    text, expected = BAD_CONFIGS[case]
    path = config_file(home, text)
    done = run_cli(home, *command, "--config", str(path))

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == f"agent-cli-gateway: invalid configuration in {path}:"
    problems = [line for line in lines[1:] if line.startswith("  - ")]
    assert len(problems) == len(lines) - 1  # nothing but problem lines after the header
    for fragment in expected:
        assert sum(fragment in p for p in problems) == 1, (fragment, problems)


def test_a_missing_explicit_config_file_exits_2(home: Path) -> None:
    done = run_cli(home, *HTTP_SERVE, "--config", str(home / "nope.toml"))
    assert done.returncode == 2
    assert "config file does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_env_override_exits_2_naming_the_variable(home: Path) -> None:
    done = run_cli(home, *HTTP_SERVE, env={"AGENT_GATEWAY_LEASE__TTL_S": "soon"})
    assert done.returncode == 2
    assert "set by env AGENT_GATEWAY_LEASE__TTL_S" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_usage_error_exits_2(home: Path) -> None:
    done = run_cli(home, "serve", "--transport", "carrier-pigeon")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


# -- serve: HTTP auth rules, and stdout stays silent ---------------------------------------


def test_http_without_a_token_exits_2_saying_how_to_set_one(home: Path) -> None:
    done = run_cli(home, "serve", "--transport", "http")
    assert done.returncode == 2
    assert "AGENT_GATEWAY_HTTP__AUTH_TOKEN" in done.stderr and "auth_token" in done.stderr
    assert done.stdout == ""


def test_an_empty_token_counts_as_no_token(home: Path) -> None:
    done = run_cli(home, "serve", "--transport", "http",
                   env={"AGENT_GATEWAY_HTTP__AUTH_TOKEN": ""})
    assert done.returncode == 2
    assert "needs a bearer token" in done.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::"])
def test_no_auth_on_a_non_loopback_host_exits_2(home: Path, host: str) -> None:
    done = run_cli(home, "serve", "--transport", "http", "--no-auth", "--host", host)
    assert done.returncode == 2
    assert "--no-auth is only allowed on a loopback host" in done.stderr
    assert done.stdout == ""


def test_no_auth_is_checked_against_the_configured_host_too(home: Path) -> None:
    path = config_file(home, '[http]\nhost = "0.0.0.0"\n')
    done = run_cli(home, "serve", "--transport", "http", "--no-auth", "--config", str(path))
    assert done.returncode == 2
    assert "'0.0.0.0'" in done.stderr


@pytest.mark.parametrize("command", [["serve"], []], ids=["serve", "default"])
def test_serve_over_stdio_prints_nothing_to_stdout(home: Path, command: list[str]) -> None:
    # stdin is /dev/null: the stdio server sees EOF at once, drains and exits. Its logs
    # (startup, shutdown) must all have gone to stderr: stdout is the protocol channel.
    done = run_cli(home, *command, env={"AGENT_GATEWAY_LOGGING__LEVEL": "debug"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.strip(), "expected the server's logs on stderr"


def test_serve_on_a_terminal_says_it_speaks_mcp_on_stderr_only(home: Path) -> None:
    """A person who types the command sees how to use it; stdout stays the protocol's."""
    import pty

    master, slave = pty.openpty()
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGENT_GATEWAY_")}
    child = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], stdin=slave,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=home,
                             env={**base, "HOME": str(home)})
    os.close(slave)
    try:
        os.write(master, b"\x04")  # Ctrl-D: EOF on the terminal ends the stdio server
        out, err = child.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        os.close(master)
    assert out == b""
    text = err.decode()
    assert "MCP server speaking JSON-RPC on stdin/stdout" in text
    # From a checkout the hint gives the command that runs from one (#44).
    assert f"claude mcp add agent-cli-gateway -- {hinted_command()}" in text
    assert hinted_command().startswith("uv run --directory ")


def test_serve_off_a_terminal_prints_no_hint(home: Path) -> None:
    done = run_cli(home, "serve")
    assert "JSON-RPC on stdin/stdout" not in done.stderr


def test_a_gateway_variable_that_matches_no_key_is_warned_with_the_nearest(
        home: Path) -> None:
    """#25 item 4: a one-underscore typo used to be ignored silently."""
    done = run_cli(home, "jobs", "list", env={"AGENT_GATEWAY_LEASE_TTL_S": "120"})
    assert done.returncode == 0, done.stderr
    assert "AGENT_GATEWAY_LEASE_TTL_S" in done.stderr
    assert "did you mean AGENT_GATEWAY_LEASE__TTL_S?" in done.stderr


def test_a_bad_env_var_is_reported_as_the_variable_on_the_command_line(home: Path) -> None:
    path = config_file(home, "[lease]\nheartbeat_s = 10\n")
    done = run_cli(home, "jobs", "list", "--config", str(path),
                   env={"AGENT_GATEWAY_LEASE__TTL_S": "soon"})
    assert done.returncode == 2
    first = done.stderr.splitlines()[0]
    assert "the environment variable AGENT_GATEWAY_LEASE__TTL_S" in first
    assert str(path) not in first
