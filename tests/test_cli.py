"""The real console entry (`python -m gateway ...`) as a subprocess, with HOME in tmp."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from gateway import __version__
from gateway.config import Settings, load_settings
from gateway.model import Completion, InstanceRow, JobStatus, NewJob

REPO = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 60  # a cold interpreter on a busy 2-core box; a hang fails instead of blocking
T = TypeVar("T")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


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
    for command in ("serve", "init", "doctor", "jobs"):
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
# and lets every tool say what is wrong: tests/server/test_first_contact.py); the entry
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


# -- jobs, against a real SQLite store ----------------------------------------------------


def in_store(settings: Settings, action: Callable[[Any], Awaitable[T]]) -> T:
    from gateway.store import open_store

    async def run() -> T:
        store = await open_store(settings)
        try:
            return await action(store)
        finally:
            await store.close()

    return anyio.run(run)


ANSWER = "héllo wörld, " * 500  # multi-byte characters: pages split them mid-way
LIVE_OWNER = "instance-live"


@pytest.fixture
def seeded(home: Path) -> tuple[Path, Settings, dict[str, str]]:
    """A SQLite store with a completed, a failed, a running and an ownerless queued job."""
    config = config_file(home, f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n')
    settings = load_settings(config)
    ids = {name: str(uuid.uuid4()) for name in ("done", "failed", "running", "stray")}

    async def seed(store: Any) -> None:
        await store.register_instance(InstanceRow(
            instance_id=LIVE_OWNER, hostname="h", boot_id="b", pid=1, pid_started_at=None,
            role="stdio", version="t"), ttl_s=3600)
        for name, provider, owner in [("done", "claude", LIVE_OWNER),
                                      ("failed", "codex", LIVE_OWNER),
                                      ("running", "claude", LIVE_OWNER),
                                      ("stray", "gemini", "instance-gone")]:
            await store.insert_job(NewJob(id=ids[name], provider=provider,
                                          request_key=f"key-{name}", owner_instance=owner),
                                   ttl_s=3600)
        await store.mark_running(ids["running"], LIVE_OWNER, ttl_s=3600)
        await store.complete(ids["done"], LIVE_OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output='{"raw": "stdout"}',
            output_bytes=17, result_json=json.dumps({"text": ANSWER, "session_id": "s-1"})))
        await store.complete(ids["failed"], LIVE_OWNER, Completion(
            status=JobStatus.FAILED, exit_code=3, error="boom", error_kind="provider_error",
            stderr_tail="something broke\n"))

    in_store(settings, seed)
    return config, settings, ids


def test_jobs_list_shows_the_jobs_and_filters_them(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    done = run_cli(home, "jobs", "list", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert all(job_id in done.stdout for job_id in ids.values())
    assert done.stdout.splitlines()[0].split()[:3] == ["ID", "PROVIDER", "STATUS"]

    only = run_cli(home, "--config", str(config), "jobs", "list", "--status", "failed",
                   "--status", "completed", "--provider", "codex")
    assert only.returncode == 0, only.stderr
    assert ids["failed"] in only.stdout
    assert ids["done"] not in only.stdout and ids["running"] not in only.stdout

    limited = run_cli(home, "jobs", "list", "--limit", "1", "--config", str(config))
    assert len(limited.stdout.splitlines()) == 2  # header + one job


def test_jobs_list_before_any_store_exists_says_so(home: Path) -> None:
    done = run_cli(home, "jobs", "list")
    assert done.returncode == 0
    assert "No jobs yet" in done.stdout
    assert not (home / ".agent-cli-gateway" / "jobs.db").exists()  # reading creates nothing


def test_jobs_show_prints_the_row_without_the_output(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    done = run_cli(home, "jobs", "show", ids["failed"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(None, 1) for line in done.stdout.splitlines()
                  if line and not line.startswith(("stderr", "something", "output")))
    assert fields["status"] == "failed"
    assert fields["error_kind"] == "provider_error"
    assert fields["exit_code"] == "3"
    assert "something broke" in done.stdout

    shown = run_cli(home, "jobs", "show", ids["done"], "--config", str(config))
    assert "héllo" not in shown.stdout  # the answer is for `jobs result`
    assert '"session_id": "s-1"' in shown.stdout


def test_jobs_result_pages_concatenate_to_the_exact_answer(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    expected = ANSWER.encode()
    pages: list[bytes] = []
    offset = 0
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "jobs", "result", ids["done"], "--config",
             str(config), "--offset", str(offset), "--max-bytes", "1001"],
            env={**os.environ, "HOME": str(home)}, capture_output=True, timeout=CLI_TIMEOUT_S,
            check=False)
        assert done.returncode == 0, done.stderr
        pages.append(done.stdout)
        offset += len(done.stdout)
        if b"next page" not in done.stderr:
            break
        assert f"--offset {offset}".encode() in done.stderr
    assert len(pages) == -(-len(expected) // 1001)
    assert b"".join(pages) == expected


def test_jobs_result_prints_an_answer_stored_as_a_range_of_the_output(home: Path) -> None:
    config = config_file(home, f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n')
    job_id = str(uuid.uuid4())
    output = "banner\nthe ánswer\n"

    async def seed(store: Any) -> None:
        await store.insert_job(NewJob(id=job_id, provider="devin", request_key="key-span",
                                      owner_instance=LIVE_OWNER), ttl_s=3600)
        await store.complete(job_id, LIVE_OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output=output,
            output_bytes=len(output.encode()), result_json=json.dumps({"text_span": [7, 18]})))

    in_store(load_settings(config), seed)
    done = run_cli(home, "jobs", "result", job_id, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the ánswer"
    raw = run_cli(home, "jobs", "result", job_id, "--raw", "--config", str(config))
    assert raw.stdout == output


def test_jobs_result_raw_prints_the_cli_stdout(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    done = run_cli(home, "jobs", "result", ids["done"], "--raw", "--config", str(config))
    assert done.returncode == 0
    assert done.stdout == '{"raw": "stdout"}'


def test_jobs_result_of_a_failed_job_exits_1_with_the_reason(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    done = run_cli(home, "jobs", "result", ids["failed"], "--config", str(config))
    assert done.returncode == 1
    assert "failed (provider_error: boom)" in done.stderr


def test_an_unknown_job_id_exits_1(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, _ = seeded
    for action in ("show", "result", "cancel"):
        done = run_cli(home, "jobs", action, "no-such-job", "--config", str(config))
        assert done.returncode == 1
        assert "no job 'no-such-job'" in done.stderr
        assert "Traceback" not in done.stderr


def test_jobs_cancel_requests_a_cancel_on_the_row(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, settings, ids = seeded
    done = run_cli(home, "jobs", "cancel", ids["running"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "Cancel requested" in done.stdout and "cancel poller" in done.stdout

    row = in_store(settings, lambda store: store.get_job(ids["running"]))
    assert row is not None and row.cancel_requested_at is not None
    assert row.status is JobStatus.RUNNING  # the owner's poller does the rest


def test_jobs_cancel_of_a_job_whose_owner_is_gone_says_so(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, _, ids = seeded
    done = run_cli(home, "jobs", "cancel", ids["stray"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "does not look alive" in done.stdout


def test_jobs_cancel_of_a_finished_job_exits_1_and_changes_nothing(
    home: Path, seeded: tuple[Path, Settings, dict[str, str]]
) -> None:
    config, settings, ids = seeded
    done = run_cli(home, "jobs", "cancel", ids["done"], "--config", str(config))
    assert done.returncode == 1
    assert "already finished as completed" in done.stdout
    row = in_store(settings, lambda store: store.get_job(ids["done"]))
    assert row is not None and row.status is JobStatus.COMPLETED


def test_jobs_commands_refuse_the_memory_backend(home: Path) -> None:
    config = config_file(home, '[persistence]\nbackend = "memory"\n')
    done = run_cli(home, "jobs", "list", "--config", str(config))
    assert done.returncode == 1
    assert "'memory'" in done.stderr


def test_an_unusable_store_is_one_line_and_exit_1(home: Path) -> None:
    garbage = home / "garbage.db"
    garbage.write_text("this is not an SQLite database\n" * 20)
    config = config_file(home, f'[persistence]\npath = "{garbage}"\n')
    done = run_cli(home, "jobs", "list", "--config", str(config))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("agent-cli-gateway: ")]
    assert ours == ["agent-cli-gateway: the job store is unavailable: sqlite store: open "
                    "failed: file is not a database"]

    debug = run_cli(home, "jobs", "list", "--debug", "--config", str(config))
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr
