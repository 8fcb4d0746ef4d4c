"""A first contact that works, and a broken setup that explains itself (issue 14).

Every test spawns `python -m gateway` with the SDK's stdio client, as an MCP host does, and
makes the session's first call: it must get the real state (ready), or the exact problem
and its fix, never a closed connection or an endless "retry".
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult

from tests.mcp.conftest import Harness, first_text, free_port, own_harness, stdio_client
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
# A permanent problem is known after one store open attempt: far less than the 10 s a call
# waits for a store that may still come up.
PERMANENT_ANSWER_S = 8.0
MODES = ["legacy", "auto"]
EVERY_TOOL: list[tuple[str, dict[str, Any]]] = [
    ("llm_job_list", {}), ("llm_job_status", {"job_id": "x"}), ("list_models", {}),
    ("claude_request", {"prompt": "p"}), ("codex_request_async", {"prompt": "p"}),
    ("no_such_tool", {}),
]


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    # The test's own monkeypatch: a bare MonkeyPatch() was never undone, so whatever the
    # harness set leaked into later tests.
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        yield harness


def data_of(result: CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result.content
    return result.structured_content


def raw_config(harness: Harness, text: str) -> Path:
    path = harness.root / "broken.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("mode", MODES)
async def test_the_first_call_of_a_session_is_gateway_status_and_it_says_ready(
        harness: Harness, mode: str) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, harness.write_config({}), mode) as client:
            status = data_of(await client.call_tool("gateway_status", {}))
    assert status["ready"] is True and status["admitting"] is True
    assert status["problem"] is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("text", "fragments"), [
    ("[limits]\nmax_runing_jobs = 4\n", ["limits.max_runing_jobs", "unknown key"]),
    ("[lease]\nttl_s = \"soon\"\n", ["lease.ttl_s", "'soon'"]),
], ids=["unknown-key", "bad-value"])
async def test_an_invalid_config_still_serves_and_every_tool_names_the_problem(
        harness: Harness, mode: str, text: str, fragments: list[str]) -> None:
    config = raw_config(harness, text)
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, mode) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            answers = [await client.call_tool(name, args) for name, args in EVERY_TOOL]
            status = await client.call_tool("gateway_status", {})
    # The installed providers' tools are listed all the same (#25): a model asked to "use
    # codex" finds codex_request, and its answer is the setup problem.
    assert {"gateway_status", "claude_request", "codex_request_async"} <= names
    for (name, _args), answer in zip(EVERY_TOOL, answers, strict=True):
        data = data_of(answer)
        assert answer.is_error, name
        assert data["error_kind"] == "setup_error" and data["retryable"] is False, name
        for fragment in [*fragments, str(config), "restart"]:
            assert fragment in data["error"], (name, fragment, data["error"])
    shown = data_of(status)
    assert not status.is_error  # it answers: the problem is its content
    assert shown["ready"] is False and shown["problem_permanent"] is True
    assert all(fragment in shown["problem"] for fragment in fragments)
    assert "BROKEN SETUP" in first_text(status)


@pytest.mark.parametrize("mode", MODES)
async def test_the_instructions_say_the_setup_is_broken_and_which_clis_are_installed(
        harness: Harness, mode: str) -> None:
    """What a model reads before any tool: the problem, and the CLIs really installed here
    (the fakes on PATH), not a fixed list (#25)."""
    config = raw_config(harness, "[limits]\nmax_runing_jobs = 4\n")
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, mode) as client:
            broken = client.instructions
            listed = {t.name for t in (await client.list_tools()).tools}
            answer = data_of(await client.call_tool("codex_request", {"prompt": "p"}))
        async with stdio_client(harness.home, harness.write_config({}), mode) as client:
            fine = client.instructions
    assert broken is not None and fine is not None
    assert broken.startswith("THE GATEWAY'S SETUP IS BROKEN")
    assert "limits.max_runing_jobs" in broken and "setup_error" in broken
    assert "codex_request" in listed and answer["error_kind"] == "setup_error"
    assert "BROKEN" not in fine
    assert "CLIs installed here (claude, codex, gemini, grok, mistral, devin, cursor)" in fine


async def test_with_no_cli_installed_the_instructions_say_so(harness: Harness) -> None:
    """A PATH with none of the CLIs: the instructions promise none of them."""
    empty = harness.root / "empty-bin"
    empty.mkdir()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, harness.write_config({}), "legacy",
                                PATH=f"{empty}:/usr/bin:/bin") as client:
            text = client.instructions
            listed = {t.name for t in (await client.list_tools()).tools}
    assert text is not None and text.startswith("No coding-agent CLI is installed here yet")
    assert not any(name.endswith("_request") for name in listed)


@pytest.mark.parametrize("mode", MODES)
async def test_an_env_var_that_is_not_json_for_a_list_still_serves_and_names_the_variable(
        harness: Harness, mode: str) -> None:
    """A list set from the client's `env` block is JSON; a bare value (once a traceback
    before the handshake) is a setup error naming the variable, its value not echoed."""
    name = "AGENT_GATEWAY_PROVIDERS__CODEX__EXTRA_ARGS"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, harness.write_config({}), mode,
                                **{name: "--secret-value"}) as client:
            answer = await client.call_tool("llm_job_list", {})
            status = data_of(await client.call_tool("gateway_status", {}))
    data = data_of(answer)
    assert answer.is_error and data["error_kind"] == "setup_error"
    for fragment in (name, "JSON", "providers.codex.extra_args", "restart"):
        assert fragment in data["error"], (fragment, data["error"])
    assert "--secret-value" not in data["error"]
    assert status["problem_permanent"] is True and name in status["problem"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_store_path_that_can_never_be_created_is_reported_as_permanent_at_once(
        harness: Harness, mode: str) -> None:
    config = harness.write_config({"persistence": {"path": "/proc/nope/jobs.db"}})
    harness.wait_ready = False
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, mode) as client:
            with anyio.fail_after(scaled(PERMANENT_ANSWER_S)):
                refused = await client.call_tool("llm_job_list", {})
                status = await client.call_tool("gateway_status", {})
    data = data_of(refused)
    assert refused.is_error and data["error_kind"] == "setup_error"
    assert data["retryable"] is False
    assert "/proc/nope/jobs.db" in data["error"]
    assert "will not pass by itself" in data["error"]
    assert "retry in a few seconds" not in data["error"].lower()
    shown = data_of(status)
    assert shown["ready"] is False and shown["problem_permanent"] is True
    assert "/proc/nope/jobs.db" in shown["problem"]


async def test_a_store_that_is_down_is_a_passing_cause_and_says_so(harness: Harness) -> None:
    down = {"persistence": {"backend": "postgres",
                            "dsn": f"postgresql://nobody@127.0.0.1:{free_port()}/none"}}
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, harness.write_config(down), "legacy") as client:
            status = data_of(await client.call_tool("gateway_status", {}))
            refused = await client.call_tool("llm_job_list", {})
    assert status["ready"] is False and status["problem_permanent"] is False
    assert "can pass by itself" in status["problem"]
    assert "Connect call failed" in status["problem"] or "refused" in status["problem"].lower()
    data = data_of(refused)
    assert data["error_kind"] == "unavailable" and data["retryable"] is True
    assert "retry in a few seconds" in data["error"]


async def test_a_missing_explicit_config_file_still_serves_and_says_which_file(
        harness: Harness) -> None:
    missing = harness.root / "nope.toml"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, missing, "legacy") as client:
            answer = await client.call_tool("llm_job_list", {})
    data = data_of(answer)
    assert data["error_kind"] == "setup_error"
    assert str(missing) in data["error"] and "does not exist" in data["error"]


async def test_a_store_written_by_a_newer_gateway_is_permanent_and_says_upgrade(
        harness: Harness) -> None:
    config = harness.write_config({})
    db = harness.db_of(config)
    db.parent.mkdir(parents=True, mode=0o700)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                     "applied_at REAL NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (999, 0)")
    db.chmod(0o600)
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, "legacy") as client:
            with anyio.fail_after(scaled(PERMANENT_ANSWER_S)):
                refused = await client.call_tool("llm_job_list", {})
    data = data_of(refused)
    assert data["error_kind"] == "setup_error" and data["retryable"] is False
    assert "newer" in data["error"] and "upgrade agent-cli-gateway" in data["error"]
    assert "will not pass by itself" in data["error"]


@pytest.mark.postgres
async def test_a_postgres_database_that_does_not_exist_is_permanent(
        harness: Harness, postgres_server: Any) -> None:
    postgres_server.ensure_running()
    dsn = postgres_server.dsn_for(f"missing_{uuid.uuid4().hex[:8]}")
    config = harness.write_config({"persistence": {"backend": "postgres", "dsn": dsn}})
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, "legacy") as client:
            with anyio.fail_after(scaled(PERMANENT_ANSWER_S)):
                status = data_of(await client.call_tool("gateway_status", {}))
    assert status["ready"] is False and status["problem_permanent"] is True
    assert "InvalidCatalogNameError" in status["problem"]
    assert "will not pass by itself" in status["problem"]


@pytest.mark.parametrize("mode", MODES)
async def test_deep_json_in_a_variable_answers_setup_error_not_a_dead_handshake(
        harness: Harness, mode: str) -> None:
    """#23 item 10: `[` * 50000 once raised RecursionError and `serve` never answered
    `initialize`; now the handshake works and every tool names the variable."""
    name = "AGENT_GATEWAY_PROVIDERS__CODEX__EXTRA_ARGS"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, harness.write_config({}), mode,
                                **{name: "[" * 50_000}) as client:
            answer = await client.call_tool("llm_job_list", {})
    data = data_of(answer)
    assert answer.is_error and data["error_kind"] == "setup_error"
    assert name in data["error"] and "deeper than" in data["error"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_bad_variable_is_reported_as_the_variable_not_the_config_file(
        harness: Harness, mode: str) -> None:
    """#25 item 4: the file is fine and the variable is not: the setup_error names the
    variable (and where it is set), not "the config file ... is invalid"."""
    config = harness.write_config({})
    name = "AGENT_GATEWAY_LEASE__TTL_S"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with stdio_client(harness.home, config, mode, **{name: "soon"}) as client:
            answer = await client.call_tool("llm_job_list", {})
    error = data_of(answer)["error"]
    assert f"the environment variable {name}" in error, error
    assert "env block" in error
    assert f"the config file {config}" not in error
