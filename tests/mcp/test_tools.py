"""The MCP tools, driven by a real MCP client over every transport (in-process, stdio
legacy and auto, Streamable HTTP) against the fake provider CLIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client
from mcp.types import CallToolResult

from gateway.config import LimitsConfig
from tests.fakes.fake_api_server import run_fake_api_server
from tests.mcp.conftest import BASE_LIMITS, JOB_TOOLS, REPO, Harness, first_text, free_port
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0  # whole-test bound: startup, runs and shutdown included
PROVIDERS = ("claude", "codex", "gemini", "grok", "mistral", "devin", "cursor")
ACTIVE = {"queued", "running"}
STARTUP_ANSWER_S = 10.0  # tools/list on a started client: no store, no CLI is awaited


def tag() -> str:
    """A unique word for a prompt: identical requests would be deduplicated across tests."""
    return uuid.uuid4().hex[:10]


async def call(client: Client, tool: str, args: dict[str, Any], **kw: Any) -> CallToolResult:
    result = await client.call_tool(tool, args, **kw)
    assert result.content, f"{tool} answered no text content"
    assert result.structured_content is not None, f"{tool} answered no structuredContent"
    return result


async def succeed(client: Client, tool: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
    result = await call(client, tool, args, **kw)
    assert not result.is_error, f"{tool} failed: {first_text(result)}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def wait_done(client: Client, job_id: str) -> dict[str, Any]:
    """llm_job_wait until the job is terminal (each call bounded by the tool itself)."""
    while True:
        data = await succeed(client, "llm_job_wait", {"job_id": job_id, "timeout_s": 20})
        if data["done"]:
            assert data["status"] not in ACTIVE
            return data
        assert data["status"] in ACTIVE


async def wait_status(client: Client, job_id: str, wanted: set[str]) -> dict[str, Any]:
    while True:
        data = await succeed(client, "llm_job_status", {"job_id": job_id})
        if data["status"] in wanted:
            return data
        await anyio.sleep(0.05)


def fake_spawns(log: Path, marker: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e for e in entries if "argv" in e and marker in e.get("prompt", "")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_lists_a_sync_and_an_async_tool_per_provider_and_the_job_tools(
        gateway: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
    expected = {f"{p}_request{s}" for p in PROVIDERS for s in ("", "_async")} | JOB_TOOLS
    assert expected <= set(tools)
    claude = tools["claude_request"].input_schema
    # Common inputs and the provider's own options, flattened, with their descriptions.
    for name in ("prompt", "model", "working_dir", "session_id", "timeout_s", "force_refresh",
                 "permission_mode", "output_format"):
        assert claude["properties"][name].get("description"), name
    assert claude["required"] == ["prompt"]
    assert claude["additionalProperties"] is False
    assert tools["llm_job_wait"].input_schema["properties"]["timeout_s"]["maximum"] == 50
    assert all(tools[name].description for name in expected)


async def test_a_sync_request_answers_with_the_parsed_text_and_native_session(
        gateway: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            for provider in PROVIDERS:
                prompt = f"hello {provider} {tag()}"
                result = await call(client, f"{provider}_request", {"prompt": prompt})
                assert not result.is_error, first_text(result)
                data = result.structured_content
                assert data is not None
                answer = f"fake-{provider} answer: {prompt}"
                assert data["status"] == "completed"
                assert data["text"].strip() == answer
                assert first_text(result).strip() == answer
                assert data["provider"] == provider
                assert data["exit_code"] == 0
                assert data["error_kind"] is None
                assert data["deduplicated"] is False
                assert data["job_id"]
            # claude's stream-json reports its native session and usage.
            data = await succeed(client, "claude_request", {"prompt": f"usage {tag()}"})
            assert data["session_id"]
            assert data["usage"]["output_tokens"] > 0


async def test_an_async_request_completes_through_wait_result_status_and_list(
        gateway: Harness) -> None:
    prompt = f"async work {tag()} @sleep=0.5"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            started = await succeed(client, "codex_request_async", {"prompt": prompt})
            job_id = started["job_id"]
            assert started["status"] in ACTIVE
            assert started["deduplicated"] is False
            assert started["next"]["tool"] == "llm_job_wait"
            assert started["next"]["arguments"] == {"job_id": started["job_id"]}

            again = await succeed(client, "codex_request_async", {"prompt": prompt})
            assert again["job_id"] == job_id and again["deduplicated"] is True

            done = await wait_done(client, job_id)
            assert done["status"] == "completed" and done["exit_code"] == 0

            result = await succeed(client, "llm_job_result", {"job_id": job_id})
            assert result["output"].strip() == f"fake-codex answer: {prompt}"
            assert result["complete"] is True and result["next_offset"] is None
            assert result["total_bytes"] == len(result["output"].encode())

            status = await succeed(client, "llm_job_status", {"job_id": job_id})
            assert status["status"] == "completed"
            assert status["finished_at"] and status["started_at"] and status["created_at"]

            listed = await succeed(client, "llm_job_list", {"provider": "codex",
                                                            "status": "completed"})
            assert job_id in {j["job_id"] for j in listed["jobs"]}


async def test_a_large_result_is_paged_and_reassembles_exactly(gateway: Harness) -> None:
    size = 3_000_000
    page_size = 350_000  # the largest page fits in one HTTP SSE event (1 MiB)
    prompt = f"big {tag()} @bytes={size}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            started = await succeed(client, "devin_request_async", {"prompt": prompt})
            job_id = started["job_id"]
            assert (await wait_done(client, job_id))["status"] == "completed"
            pieces: list[str] = []
            offset: int | None = 0
            pages = 0
            while offset is not None:
                page = await succeed(client, "llm_job_result",
                                     {"job_id": job_id, "offset": offset, "max_bytes": page_size,
                                      "raw": True})
                assert page["offset"] == offset
                pieces.append(page["output"])
                offset = page["next_offset"]
                pages += 1
            assert page["complete"] is True
    whole = "".join(pieces)
    expected = "x" * (size - 1) + "\n" + f"fake-devin answer: {prompt}\n"
    assert pages == -(-len(expected.encode()) // page_size)
    assert len(whole.encode()) == page["total_bytes"]
    assert whole == expected


async def test_cancelling_a_running_job_kills_its_process_and_marks_it_cancelled(
        gateway: Harness) -> None:
    marker = tag()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            started = await succeed(client, "gemini_request_async",
                                    {"prompt": f"long {marker} @sleep=30"})
            job_id = started["job_id"]
            await wait_status(client, job_id, {"running"})
            while not fake_spawns(gateway.fake_log, marker):
                await anyio.sleep(0.05)
            pid = fake_spawns(gateway.fake_log, marker)[0]["pid"]

            cancelled = await succeed(client, "llm_job_cancel", {"job_id": job_id})
            assert cancelled["outcome"] == "cancelled"
            assert cancelled["status"] == "cancelled"
            assert cancelled["error_kind"] == "cancelled"
            status = await succeed(client, "llm_job_status", {"job_id": job_id})
            assert status["status"] == "cancelled"
            again = await succeed(client, "llm_job_cancel", {"job_id": job_id})
            assert again["outcome"] == "already_terminal"
    assert not alive(pid)


async def test_a_running_jobs_result_says_in_its_structured_content_that_it_is_raw_output(
        gateway: Harness) -> None:
    """Claude Code and Codex show the model only the structured content: a running job's
    page must say there, not only in the text, that it is the CLI's stream so far (#25)."""
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            started = await succeed(client, "claude_request_async",
                                    {"prompt": f"streams {tag()} @stream=400:0.1"})
            job_id = started["job_id"]
            while True:  # until the CLI wrote its first events
                result = await call(client, "llm_job_result", {"job_id": job_id})
                page = result.structured_content
                assert page is not None and page["status"] in ACTIVE, page
                if page["output"]:
                    break
                await anyio.sleep(0.05)
            await succeed(client, "llm_job_cancel", {"job_id": job_id})
    assert page["raw"] is True and page["complete"] is False
    assert '"type"' in page["output"]  # stream-json events, not an answer
    assert "still running" in page["message"] and "raw output" in page["message"]
    assert page["message"] in first_text(result)
    assert page["next"]["tool"] in {"llm_job_wait", "llm_job_result"}


async def test_progress_notifications_arrive_during_a_sync_request_and_a_wait(
        gateway: Harness) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            prompt = f"streams {tag()} @stream=15:0.1"
            data = await succeed(client, "claude_request", {"prompt": prompt},
                                 progress_callback=on_progress)
            assert data["status"] == "completed"
            during_request = list(seen)
            seen.clear()

            started = await succeed(client, "grok_request_async",
                                    {"prompt": f"wait {tag()} @stream=15:0.1"})
            done = await succeed(client, "llm_job_wait",
                                 {"job_id": started["job_id"], "timeout_s": 30},
                                 progress_callback=on_progress)
            assert done["done"] is True
            during_wait = list(seen)
    for notes in (during_request, during_wait):
        assert any(m and "bytes of output" in m for _, m in notes), notes
        values = [p for p, _ in notes]
        assert values == sorted(values) and len(set(values)) == len(values)
    # Output grew while the request ran, and the messages said so.
    assert any(m and " 0 bytes" not in m and "bytes of output" in m for _, m in during_request)


async def test_a_sync_request_past_the_deferral_point_returns_a_job_to_poll(
        gateway: Harness) -> None:
    prompt = f"slow {tag()} @sleep=2"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(limits={"sync_defer_after_s": 1}) as client:
            result = await call(client, "mistral_request", {"prompt": prompt})
            assert not result.is_error
            data = result.structured_content
            assert data is not None
            assert data["deferred"] is True
            assert data["status"] in ACTIVE
            assert data["next"] == {"tool": "llm_job_wait", "arguments": {"job_id": data["job_id"]},
                                    "why": data["next"]["why"]}
            assert "llm_job_wait" in first_text(result)
            done = await wait_done(client, data["job_id"])
            assert done["status"] == "completed"
            page = await succeed(client, "llm_job_result", {"job_id": data["job_id"]})
            assert page["output"].strip() == f"fake-mistral answer: {prompt}"


async def test_a_failed_run_is_an_error_answer_with_its_kind_and_next_step(
        gateway: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            auth = await call(client, "claude_request", {"prompt": f"who {tag()} @auth"})
            assert auth.is_error
            assert auth.structured_content is not None
            assert auth.structured_content["error_kind"] == "auth"
            assert auth.structured_content["status"] == "failed"
            assert "log" in first_text(auth).lower()

            failed = await call(client, "cursor_request",
                                {"prompt": f"boom {tag()} @exit=3 @stderr=kaputt"})
            assert failed.is_error
            assert failed.structured_content is not None
            assert failed.structured_content["error_kind"] == "provider_error"
            assert failed.structured_content["exit_code"] == 3
            assert failed.structured_content["retryable"] is False

            late = await call(client, "gemini_request",
                              {"prompt": f"late {tag()} @sleep=20", "timeout_s": 0.5})
            assert late.is_error
            assert late.structured_content is not None
            assert late.structured_content["status"] == "timed_out"
            assert late.structured_content["error_kind"] == "timeout"
            assert "timeout_s" in first_text(late)


BAD_INPUTS: list[tuple[str, str, dict[str, Any], str]] = [
    ("unknown job id", "llm_job_status", {"job_id": "no-such-job"}, "job_not_found"),
    ("unknown job id to wait on", "llm_job_wait", {"job_id": "no-such-job", "timeout_s": 1},
     "job_not_found"),
    ("empty prompt", "claude_request", {"prompt": "   "}, "invalid_input"),
    ("missing prompt", "claude_request", {}, "invalid_input"),
    ("NUL in prompt", "claude_request", {"prompt": "a\x00b"}, "invalid_input"),
    ("prompt too big", "claude_request", {"prompt": "x" * 5000}, "invalid_input"),
    ("working_dir missing", "claude_request",
     {"prompt": "p", "working_dir": "/nonexistent/gateway-test-dir"}, "invalid_input"),
    ("relative working_dir", "claude_request", {"prompt": "p", "working_dir": "some/dir"},
     "invalid_input"),
    ("bad option value", "claude_request", {"prompt": "p", "output_format": "xml"},
     "invalid_input"),
    ("unknown option", "claude_request", {"prompt": "p", "turbo_mode": True}, "invalid_input"),
    ("zero timeout", "claude_request", {"prompt": "p", "timeout_s": 0}, "invalid_input"),
    ("negative timeout", "codex_request_async", {"prompt": "p", "timeout_s": -1},
     "invalid_input"),
    ("max_bytes 0", "llm_job_result", {"job_id": "any", "max_bytes": 0}, "invalid_input"),
    ("negative offset", "llm_job_result", {"job_id": "any", "offset": -1}, "invalid_input"),
    ("wait above 50 s", "llm_job_wait", {"job_id": "any", "timeout_s": 51}, "invalid_input"),
    ("unknown status filter", "llm_job_list", {"status": "exploded"}, "invalid_input"),
    ("limit 0", "llm_job_list", {"limit": 0}, "invalid_input"),
    ("unknown provider for models", "list_models", {"provider": "nope"}, "invalid_input"),
    ("wrong type of prompt", "claude_request", {"prompt": 42}, "invalid_input"),
    ("wrong type of timeout", "gemini_request", {"prompt": "p", "timeout_s": "soon"},
     "invalid_input"),
    ("wrong type of a list option", "claude_request", {"prompt": "p", "add_dirs": "/tmp"},
     "invalid_input"),
    ("missing CLI", "grok_request", {"prompt": "p"}, "not_found"),
    ("unknown tool", "no_such_tool", {}, "invalid_input"),
    ("disabled provider", "devin_request", {"prompt": "p"}, "invalid_input"),
]


async def test_bad_inputs_get_a_clear_error_with_a_kind_and_what_to_do(gateway: Harness) -> None:
    overrides = {"limits": {"max_prompt_bytes": 1000},
                 "providers": {"grok": {"command": "/nonexistent/bin/grok"},
                               "devin": {"enabled": False}}}
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(**overrides) as client:
            for label, tool, args, kind in BAD_INPUTS:
                result = await call(client, tool, args)
                data = result.structured_content
                assert result.is_error, label
                assert data is not None, label
                assert data["error_kind"] == kind, (label, data)
                assert data["retryable"] is False, label
                assert len(data["error"]) > 20, (label, data["error"])
                assert first_text(result), label
            # Nothing was started by any of them.
            listed = await succeed(client, "llm_job_list", {})
            assert listed["count"] == 0
            # Neither a disabled provider nor one whose CLI is missing is listed (a call
            # still answers, as above); the others are.
            names = {t.name for t in (await client.list_tools()).tools}
            assert not {"devin_request", "devin_request_async", "grok_request"} & names
            assert {"claude_request", "codex_request_async"} <= names


async def test_a_saturated_gateway_refuses_with_a_retryable_error(gateway: Harness) -> None:
    tight = {"limits": {"max_running_jobs": 1, "max_running_per_provider": 1,
                        "max_queued_jobs": 0}}
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(**tight) as client:
            first = await succeed(client, "claude_request_async",
                                  {"prompt": f"hog {tag()} @sleep=30"})
            refused = await call(client, "codex_request_async", {"prompt": f"more {tag()}"})
            assert refused.is_error
            assert refused.structured_content is not None
            assert refused.structured_content["error_kind"] == "saturated"
            assert refused.structured_content["retryable"] is True
            status = await succeed(client, "gateway_status", {})
            assert status["jobs"]["running_by_provider"] == {"claude": 1}
            await succeed(client, "llm_job_cancel", {"job_id": first["job_id"]})


async def test_gateway_status_and_list_models_describe_the_installation(
        gateway: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            # Any job tool waits for startup; after it the gateway is ready. CLI versions
            # are probed in the background after that.
            await succeed(client, "llm_job_list", {})
            status = await succeed(client, "gateway_status", {})
            while not status["versions_probed"]:
                await anyio.sleep(0.1)
                status = await succeed(client, "gateway_status", {})
            models = await succeed(client, "list_models", {})
            one = await succeed(client, "list_models", {"provider": "claude"})
    assert status["ready"] is True and status["admitting"] is True
    assert status["backend"] == "sqlite"
    assert status["instance_id"]
    # The configured limits, not the defaults: the harness sets kill_grace_s.
    assert status["limits"] == {**LimitsConfig().model_dump(mode="json"), **BASE_LIMITS}
    assert status["jobs"]["running"] == 0
    claude = status["providers"]["claude"]
    assert claude["found"] is True and claude["path"].endswith("tests/fakes/bin/claude")
    assert claude["version"] == "claude 0.0.0-fake"
    assert status["providers"]["gemini"]["path"].endswith("tests/fakes/bin/agy")
    assert set(models["providers"]) == set(PROVIDERS)
    assert "sonnet" in one["providers"]["claude"]["known_models"]
    assert set(one["providers"]) == {"claude"}


async def test_an_http_api_provider_gets_tools_with_its_own_request_fields(
        gateway: Harness) -> None:
    async with run_fake_api_server() as api:
        overrides = {"api_providers": {"router": {
            "kind": "openai", "base_url": api.base_url + "/v1", "default_model": "m-1",
            "timeout_s": 10}}}
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with gateway.connect(**overrides) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                schema = tools["router_request"].input_schema["properties"]
                assert {"prompt", "messages", "system", "temperature", "max_output_tokens",
                        "model", "timeout_s", "force_refresh"} <= set(schema)
                assert "working_dir" not in schema
                assert "router_request_async" in tools

                answer = await succeed(client, "router_request",
                                       {"prompt": f"hi {tag()}", "system": "Be brief.",
                                        "temperature": 0.25})
                assert answer["status"] == "completed"
                assert answer["text"] == "Hello, world"
                assert answer["usage"]["input_tokens"] == 11
                sent = api.requests[-1].body
                assert sent["temperature"] == 0.25 and sent["model"] == "m-1"
                assert sent["messages"][0] == {"role": "system", "content": "Be brief."}

                started = await succeed(client, "router_request_async", {"messages": [
                    {"role": "user", "content": f"a {tag()}"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"}]})
                assert (await wait_done(client, started["job_id"]))["status"] == "completed"
                assert [m["role"] for m in api.requests[-1].body["messages"]] == [
                    "user", "assistant", "user"]

                for bad in ({"prompt": "p", "messages": [{"role": "user", "content": "x"}]},
                            {"prompt": "p", "temperature": 5},
                            {"messages": [{"role": "robot", "content": "x"}]}):
                    refused = await call(client, "router_request", bad)
                    assert refused.is_error, bad
                    assert refused.structured_content is not None
                    assert refused.structured_content["error_kind"] == "invalid_input", bad


LAX_COERCIONS: list[tuple[str, dict[str, Any]]] = [
    ("codex_request", {"dangerously_bypass_approvals_and_sandbox": "true"}),
    ("codex_request_async", {"dangerously_bypass_approvals_and_sandbox": 1}),
    ("grok_request", {"always_approve": "yes"}),
    ("cursor_request", {"force": "True"}),
    ("claude_request", {"force_refresh": "yes"}),
    ("claude_request", {"model": ""}),
    ("claude_request", {"session_id": ""}),
    ("claude_request", {"timeout_s": "30"}),
    ("claude_request", {"timeout_s": 1e308}),
    ("claude_request", {"add_dirs": ["relative/dir"]}),
    ("codex_request", {"add_dirs": ["~/src"]}),
    ("router_request", {"max_output_tokens": 2**70}),
    ("router_request", {"max_output_tokens": "100"}),
    ("router_request", {"temperature": "0.5"}),
]


async def test_lax_coercion_of_dangerous_inputs_is_refused(gateway: Harness) -> None:
    """#23 item 9: a boolean that widens permissions is only JSON `true` (never "true",
    "yes" or 1), a model name is not empty, every number has a bound, add_dirs are absolute;
    none of them reaches the store."""
    async with run_fake_api_server() as api:
        overrides = {"api_providers": {"router": {
            "kind": "openai", "base_url": api.base_url + "/v1", "timeout_s": 10}}}
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with gateway.connect(**overrides) as client:
                for tool, extra in LAX_COERCIONS:
                    result = await call(client, tool, {"prompt": f"p {tag()}", **extra})
                    assert result.is_error, (tool, extra)
                    data = result.structured_content
                    assert data is not None and data["error_kind"] == "invalid_input", data
                    (name,) = extra
                    assert name in data["error"], data["error"]
                listed = await succeed(client, "llm_job_list", {})
                assert listed["count"] == 0
                assert not api.requests


async def test_tools_are_listed_at_once_even_while_the_job_store_cannot_open(
        gateway: Harness) -> None:
    """The lifespan only starts the gateway: initialize and tools/list never wait for the
    store, and gateway_status says what is wrong instead of hanging."""
    unreachable = {"persistence": {"backend": "postgres",
                                   "dsn": f"postgresql://nobody@127.0.0.1:{free_port()}/none"}}
    gateway.wait_ready = False
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(**unreachable) as client:
            with anyio.fail_after(scaled(STARTUP_ANSWER_S)):
                tools = (await client.list_tools()).tools
                status = await succeed(client, "gateway_status", {})
    assert len(tools) == 2 * len(PROVIDERS) + len(JOB_TOOLS)
    assert status["ready"] is False and status["admitting"] is False
    assert status["backend"] == "postgres"


async def test_listing_the_tools_starts_the_gateway_without_a_tool_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over stdio the job machinery loads once the handshake is answered: the first
    tools/list is the cue (the fallback bound is pushed out of reach here)."""
    from gateway.config import load_settings
    from gateway.mcp import server as server_module

    monkeypatch.setattr(server_module, "START_DEFER_MAX_S", 3600.0)
    monkeypatch.setenv("HOME", str(tmp_path))
    db = tmp_path / "state" / "jobs.db"
    server = server_module.build_server(
        load_settings(persistence={"backend": "sqlite", "path": str(db)}), role="stdio")
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with Client(server) as client:
            running = server.state.gateway
            assert running is not None
            assert await running.wait_ready(0.3) is False and not db.exists()
            await client.list_tools()
            assert await running.wait_ready(STARTUP_ANSWER_S) is True
    assert db.exists()


def test_answering_tools_list_imports_none_of_the_job_machinery(tmp_path: Path) -> None:
    """What initialize and tools/list need stays light (a client waits for them at
    startup): the store driver, the runner, the job manager, psutil and the HTTP API client
    load only when the gateway starts, after the handshake."""
    script = (
        "import asyncio, sys\n"
        "from gateway.config import Settings\n"
        "from gateway.mcp.server import build_server\n"
        "asyncio.run(build_server(Settings()).list_tools())\n"
        "print(' '.join(sorted(m for m in sys.modules if m in sys.argv[1:])))\n")
    heavy = ["gateway.jobs.manager", "gateway.jobs.run.runner", "gateway.jobs.leases",
             "gateway.store.sqlite.store", "aiosqlite", "psutil", "gateway.jobs.http_call"]
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("AGENT_GATEWAY_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", script, *heavy], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=TEST_TIMEOUT_S, check=True)
    assert done.stdout.split() == []


async def test_a_deleted_sqlite_file_is_reported_by_gateway_status_and_admission_errors(
        gateway: Harness, tmp_path: Path) -> None:
    """Regression (issue 15, item 9): the gateway kept writing into the unlinked file."""
    db = tmp_path / f"deleted-{tag()}" / "jobs.db"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(persistence={"backend": "sqlite", "path": str(db)}) as client:
            await succeed(client, "llm_job_list", {})  # started: the store is open
            for path in (db, db.with_name("jobs.db-wal"), db.with_name("jobs.db-shm")):
                path.unlink(missing_ok=True)
            status = await succeed(client, "gateway_status", {})
            while not status["store_problem"]:
                await anyio.sleep(0.1)
                status = await succeed(client, "gateway_status", {})
            text = first_text(await call(client, "gateway_status", {}))
            refused = await call(client, "claude_request_async", {"prompt": f"x {tag()}"})
    assert status["admitting"] is False and "deleted" in status["store_problem"]
    assert "STORE PROBLEM" in text and str(db) in text
    assert refused.is_error and refused.structured_content is not None
    assert refused.structured_content["error_kind"] == "unavailable"
    assert "deleted" in first_text(refused)
