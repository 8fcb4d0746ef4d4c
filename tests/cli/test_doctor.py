"""`doctor`: config, store and provider checks against real files, a real PostgreSQL and
the fake CLIs of tests/fakes/bin; exit codes through the real console entry."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

from gateway.cli.doctor import Check, Report, run_doctor
from gateway.config import PROVIDER_NAMES, load_settings
from gateway.store.base import SCHEMA_VERSION
from neutral.redaction import REDACTED
from tests.conftest import clean_home
from tests.waiting import scaled

FAKE_BIN = Path(__file__).resolve().parents[1] / "fakes" / "bin"
CLI_TIMEOUT_S = scaled(60)  # a cold interpreter plus seven --version probes on a busy 2-core box
BINARIES = {"claude": "claude", "codex": "codex", "gemini": "agy", "grok": "grok",
            "mistral": "vibe", "devin": "devin", "cursor": "cursor-agent"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = clean_home(tmp_path, monkeypatch)
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}/usr/bin{os.pathsep}/bin")
    return home


def config(home: Path, text: str) -> Path:
    path = home / "gw.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def fakes(home: Path, text: str = "", **commands: str) -> Path:
    """A config pointing every CLI provider at its fake (or at `commands[name]`): doctor
    never finds, nor runs, a real CLI the host may have in /usr/bin."""
    tables = "".join(
        f'[providers.{name}]\ncommand = "{commands.get(name, FAKE_BIN / binary)}"\n'
        for name, binary in BINARIES.items())
    return config(home, text + tables)


def by_name(report: Report) -> dict[str, Check]:
    return {check.name: check for check in report.checks}


def doctor_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "doctor", *args],
        env={**os.environ, "HOME": str(home)}, cwd=home, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )


# -- config and store ----------------------------------------------------------------------


def test_without_a_config_file_it_uses_defaults_and_creates_nothing(home: Path) -> None:
    checks = by_name(run_doctor(None, client_path=str(home)))
    assert checks["config"].status == "ok"
    assert "using the defaults" in checks["config"].summary
    assert checks["store"].status == "ok"
    assert "not created yet" in checks["store"].summary
    assert not (home / ".agent-cli-gateway").exists()


def test_an_invalid_config_is_an_error_and_the_store_is_skipped(home: Path) -> None:
    report = run_doctor(config(home, "[lease]\nttl = 1\n"))
    checks = by_name(report)
    assert not report.ok
    assert checks["config"].status == "error"
    assert any("lease.ttl" in p for p in checks["config"].details["problems"])
    assert checks["store"].status == "skipped"
    assert {name for name in PROVIDER_NAMES} <= set(checks)  # providers still checked


def test_a_config_readable_by_others_is_a_warning(home: Path) -> None:
    path = config(home, "")
    path.chmod(0o644)
    check = by_name(run_doctor(path))["config"]
    assert check.status == "warning"
    assert f"chmod 600 {path}" in check.summary


def test_an_existing_sqlite_store_reports_its_schema_version(home: Path) -> None:
    path = config(home, f'[persistence]\npath = "{home / "jobs.db"}"\n')
    anyio.run(_create_schema, path)
    check = by_name(run_doctor(path))["store"]
    assert check.status == "ok"
    assert check.details["schema_version"] == SCHEMA_VERSION
    assert f"schema version {SCHEMA_VERSION}" in check.summary


async def _create_schema(path: Path) -> None:
    from gateway.store import open_store

    store = await open_store(load_settings(path))
    await store.close()


async def _pg_tables(dsn: str) -> list[str]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT table_name FROM information_schema.tables "
                                "WHERE table_schema = current_schema()")
        return sorted(row["table_name"] for row in rows)
    finally:
        await conn.close()


def test_doctor_on_a_fresh_postgres_database_creates_no_table(
    home: Path, postgres_dsn: str
) -> None:
    path = fakes(home, f'[persistence]\nbackend = "postgres"\ndsn = "{postgres_dsn}"\n')
    done = doctor_cli(home, "--config", str(path), "--json")
    report = json.loads(done.stdout)
    store = next(c for c in report["checks"] if c["name"] == "store")
    assert store["status"] == "ok", store
    assert store["details"]["schema_version"] is None
    assert "no schema yet" in store["summary"] and "`serve` creates" in store["summary"]
    assert anyio.run(_pg_tables, postgres_dsn) == []


def test_doctor_never_migrates_an_older_postgres_schema(home: Path, postgres_dsn: str) -> None:
    async def older() -> None:
        import asyncpg

        conn = await asyncpg.connect(postgres_dsn)
        try:
            await conn.execute("CREATE TABLE schema_version (version integer PRIMARY KEY, "
                               "applied_at timestamptz NOT NULL)")
            await conn.execute("INSERT INTO schema_version VALUES (1, now())")
        finally:
            await conn.close()

    anyio.run(older)
    path = fakes(home, f'[persistence]\nbackend = "postgres"\ndsn = "{postgres_dsn}"\n')
    check = by_name(run_doctor(path))["store"]
    assert check.status == "warning"
    assert check.details["schema_version"] == 1
    assert f"migrates it from version 1 to {SCHEMA_VERSION}" in check.summary
    # The connection budget against the server's (#29): counted, never written.
    connections = check.details["connections"]
    assert connections["max_connections"] >= connections["client_connections"] >= 1
    assert "gateways hold 0 of the server's" in check.summary
    assert "pool_max 2 (stdio) / 10 (http) + 1 for its heartbeat" in check.summary
    assert anyio.run(_pg_tables, postgres_dsn) == ["schema_version"]


def test_an_sqlite_file_without_a_schema_is_reported_and_left_as_it_is(home: Path) -> None:
    db = home / "jobs.db"
    db.write_bytes(b"")  # an empty file is an empty SQLite database
    check = by_name(run_doctor(config(home, f'[persistence]\npath = "{db}"\n')))["store"]
    assert check.status == "ok" and check.details["schema_version"] is None
    assert "no schema yet" in check.summary
    assert db.read_bytes() == b""


def test_an_unusable_sqlite_store_is_an_error(home: Path) -> None:
    garbage = home / "jobs.db"
    garbage.write_text("not a database\n" * 50)
    report = run_doctor(config(home, f'[persistence]\npath = "{garbage}"\n'))
    assert not report.ok
    assert by_name(report)["store"].status == "error"


@pytest.mark.parametrize("where", ["/proc/nope/jobs.db", "FILE/sub/jobs.db"],
                         ids=["under-proc", "under-a-file"])
def test_a_store_path_that_can_never_be_created_is_an_error(home: Path, where: str) -> None:
    blocker = home / "a-file"
    blocker.write_text("x")
    path = where.replace("FILE", str(blocker))
    report = run_doctor(config(home, f'[persistence]\npath = "{path}"\n'))
    check = by_name(report)["store"]
    assert not report.ok
    assert check.status == "error"
    assert "cannot be created" in check.summary and path in check.summary
    assert "[persistence] path" in check.summary
    assert not list(home.glob(".agent-cli-gateway-doctor-*"))  # the probe is gone


def test_the_memory_store_is_fine_but_says_jobs_do_not_survive(home: Path) -> None:
    check = by_name(run_doctor(config(home, '[persistence]\nbackend = "memory"\n')))["store"]
    assert check.status == "ok" and "lost when the gateway exits" in check.summary


def test_a_reachable_postgres_reports_its_schema_and_hides_the_password(
    home: Path, postgres_server: Any, postgres_dsn: str
) -> None:
    # Trust auth ignores the password: it is there to prove doctor never prints it.
    dsn = postgres_server.dsn_for(urlsplit(postgres_dsn).path.lstrip("/"),
                                 password="hunter2")
    path = fakes(home, f'[persistence]\nbackend = "postgres"\ndsn = "{dsn}"\n')
    anyio.run(_create_schema, path)
    report = run_doctor(path)
    check = by_name(report)["store"]
    assert check.status == "ok", check.summary
    assert check.details["schema_version"] == SCHEMA_VERSION
    assert "hunter2" not in json.dumps(report.as_dict())
    assert f"postgres:{REDACTED}@" in check.summary


def test_an_unreachable_postgres_is_an_error_without_the_password(home: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dsn = f"postgresql://gw:hunter2@127.0.0.1:{port}/gw"
    report = run_doctor(config(home, f'[persistence]\nbackend = "postgres"\ndsn = "{dsn}"\n'))
    check = by_name(report)["store"]
    assert check.status == "error"
    assert "unreachable" in check.summary
    assert "hunter2" not in json.dumps(report.as_dict())


# -- provider CLIs ---------------------------------------------------------------------------


def test_a_cli_is_found_with_its_version(home: Path) -> None:
    check = by_name(run_doctor(fakes(home)))["grok"]
    assert check.status == "ok"
    assert check.details["path"] == str(FAKE_BIN / "grok")
    assert check.details["version"] == "grok 0.0.0-fake"


def test_a_cli_only_the_shells_path_finds_is_a_warning_naming_the_dir(home: Path) -> None:
    # PATH (the fixture's) has the fakes; an MCP client's minimal PATH would not.
    report = run_doctor(config(home, ""), client_path=str(home / "empty"))
    check = by_name(report)["claude"]
    assert check.status == "warning"
    assert check.details["missed_by_client_path"] == str(FAKE_BIN)
    assert f'command = "{FAKE_BIN / "claude"}"' in check.summary


def documented_verdict() -> str:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text("utf-8")
    found = re.search(r"^```text\n(From this shell:.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert found, "docs/operations.md lost its doctor verdict example"
    return found.group(1)


def test_doctor_on_a_shell_only_path_exits_0_with_a_verdict_per_context(home: Path) -> None:
    """`run` works from this shell, so doctor must not say "Not ready" (#25): it says which
    providers each context can use and what a desktop client's server entry needs."""
    done = doctor_cli(home, "--config", str(config(home, "")))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    # The fakes of devin and grok need no login that doctor could miss.
    assert "From this shell: devin, grok." in lines
    assert any(line.startswith("From a desktop client (PATH /usr/bin:/bin:/usr/sbin:/sbin")
               and line.endswith("no provider is usable.") for line in lines), lines
    env_path = os.pathsep.join([str(FAKE_BIN), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    assert f'    "env": {{"PATH": "{env_path}"}}' in done.stdout
    assert lines[-1].startswith("Ready from this shell, not from a desktop client")
    # docs/operations.md shows this verdict: it is this output, but for the CLIs' directory
    # and the count of warnings (tests/test_docs_blocks.py holds every other docs block).
    documented = documented_verdict().replace("/home/me/tools/bin", str(FAKE_BIN))
    warnings = re.compile(r"\(\d+ warning\(s\)\)")
    printed = [warnings.sub("(N warning(s))", line) for line in lines]
    wanted = [warnings.sub("(N warning(s))", line) for line in documented.splitlines()]
    at = printed.index(wanted[0])
    assert printed[at:at + len(wanted)] == wanted, done.stdout

    as_json = json.loads(doctor_cli(home, "--config", str(config(home, "")), "--json").stdout)
    verdict = next(c for c in as_json["checks"] if c["name"] == "providers")
    assert verdict["status"] == "warning"
    assert verdict["details"]["usable_from_shell"] == ["devin", "grok"]
    assert verdict["details"]["usable_from_client"] == []
    assert verdict["details"]["client_env_path"] == env_path


def test_a_cli_on_the_clients_path_too_is_usable_from_both_contexts(home: Path) -> None:
    verdict = by_name(run_doctor(fakes(home), client_path=str(FAKE_BIN)))["providers"]
    assert verdict.status == "ok"
    assert verdict.details["usable_from_client"] == verdict.details["usable_from_shell"]
    assert {"devin", "grok"} <= set(verdict.details["usable_from_client"])
    assert "client_env_path" not in verdict.details


def test_codex_login_is_read_from_its_offline_status_command(home: Path) -> None:
    check = by_name(run_doctor(fakes(home)))["codex"]
    assert check.details["logged_in"] == "no"
    assert "`codex login status`: Not logged in" in check.details["login_check"]
    assert check.status == "warning" and "codex login" in check.summary

    (home / ".codex").mkdir()
    (home / ".codex" / "auth.json").write_text("{}")
    check = by_name(run_doctor(fakes(home)))["codex"]
    assert check.status == "ok", check.summary
    assert check.details["logged_in"] == "yes"
    assert "Logged in using ChatGPT" in check.details["login_check"]


def test_claude_login_is_its_credentials_file_or_a_key_in_its_env(home: Path) -> None:
    assert by_name(run_doctor(fakes(home)))["claude"].details["logged_in"] == "no"
    keyed = fakes(home).read_text().replace(
        '[providers.claude]\n', '[providers.claude]\nenv = { ANTHROPIC_API_KEY = "sk-x" }\n')
    check = by_name(run_doctor(config(home, keyed)))["claude"]
    assert check.details["logged_in"] == "yes" and "[providers.claude] env" in check.summary
    assert "sk-x" not in json.dumps(check.details)

    (home / ".claude").mkdir()
    (home / ".claude" / ".credentials.json").write_text("{}")
    check = by_name(run_doctor(fakes(home)))["claude"]
    assert check.details["logged_in"] == "yes" and check.status == "ok"


def test_a_cli_without_an_offline_check_says_it_cannot_tell(home: Path) -> None:
    check = by_name(run_doctor(fakes(home)))["devin"]
    assert check.details["logged_in"] == "cannot tell"
    assert check.status == "ok"


def test_doctor_is_not_ready_when_no_provider_is_usable(home: Path) -> None:
    missing = {name: f"/nonexistent/{name}" for name in BINARIES}
    done = doctor_cli(home, "--config", str(fakes(home, **missing)))
    assert done.returncode == 1, done.stdout
    assert "FAIL  providers  no provider is usable" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("Not ready")


def test_a_missing_cli_is_a_warning_with_an_install_hint_not_a_failure(home: Path) -> None:
    report = run_doctor(fakes(home, grok="/nonexistent/grok"))
    check = by_name(report)["grok"]
    assert check.status == "warning"
    assert "not found" in check.summary and check.details["install_hint"] in check.summary
    assert report.ok


def test_a_cli_whose_version_fails_is_a_warning(home: Path) -> None:
    check = by_name(run_doctor(fakes(home, devin="/bin/false")))["devin"]
    assert check.status == "warning"
    assert check.details["path"] == "/bin/false"
    assert "--version" in check.details["version_error"]


def test_a_disabled_provider_is_not_probed(home: Path) -> None:
    text = fakes(home).read_text()
    path = config(home, text.replace("[providers.cursor]\n", "[providers.cursor]\nenabled = false\n"))
    check = by_name(run_doctor(path))["cursor"]
    assert check.status == "disabled"
    assert "path" not in check.details


# -- API providers ---------------------------------------------------------------------------


API = '[api_providers.openrouter]\nkind = "openai"\nbase_url = "https://o.example/api"\n' \
      'api_key_env = "DOCTOR_TEST_KEY"\n'


def test_an_api_provider_with_its_key_set_is_ok_and_the_key_is_never_shown(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCTOR_TEST_KEY", "sk-very-secret")
    report = run_doctor(fakes(home, API))
    check = by_name(report)["openrouter"]
    assert check.status == "ok" and check.details["api_key_set"] is True
    assert "sk-very-secret" not in json.dumps(report.as_dict())


def test_an_api_provider_whose_key_is_unset_is_a_warning(home: Path) -> None:
    check = by_name(run_doctor(fakes(home, API)))["openrouter"]
    assert check.status == "warning"
    assert "$DOCTOR_TEST_KEY is not set" in check.summary


# -- through the console entry ---------------------------------------------------------------


def test_doctor_exits_0_when_only_warnings_remain(home: Path) -> None:
    done = doctor_cli(home, "--config", str(fakes(home)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "claude 0.0.0-fake" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("Ready")


def test_doctor_exits_1_when_the_store_is_broken(home: Path) -> None:
    garbage = home / "jobs.db"
    garbage.write_text("not a database\n" * 50)
    done = doctor_cli(home, "--config", str(fakes(home, f'[persistence]\npath = "{garbage}"\n')))
    assert done.returncode == 1
    assert "FAIL  store" in done.stdout


def test_doctor_exits_2_for_a_bad_config_and_lists_the_problems(home: Path) -> None:
    done = doctor_cli(home, "--config", str(config(home, "[limits]\nmax_running_jobs = 0\n")))
    assert done.returncode == 2
    assert "limits.max_running_jobs" in done.stdout
    assert "Traceback" not in done.stderr


def test_doctor_json_is_machine_readable(home: Path) -> None:
    done = doctor_cli(home, "--json", "--config", str(fakes(home)))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    names = [check["name"] for check in report["checks"]]
    assert names == ["config", "store", *PROVIDER_NAMES, "providers"]
    assert "grok" in report["checks"][-1]["details"]["usable"]
