"""MCP Tasks, the 2026-07-28 extension (`io.modelcontextprotocol/tasks`), through the SDK's
own Python client with a small ClientExtension (task_client.py), in-process, over stdio and
over Streamable HTTP, against the fake CLIs."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.mcp.conftest import (
    CLIENT_TIMEOUT_S,
    TOKEN,
    Harness,
    own_harness,
    server_env,
)
from tests.mcp.task_client import (
    CreatedTask,
    TasksClientExtension,
    call_as_task,
    raw_stdio,
    send,
    spawned_pid,
)
from tests.mcp.test_tools import alive, tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
TRANSPORTS = ["inproc", "stdio-auto", "http"]
MODERN_HEADERS = {"Accept": "application/json, text/event-stream",
                  "Content-Type": "application/json"}


@pytest.fixture(params=TRANSPORTS)
def harness(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness(str(request.param), tmp_path, monkeypatch) as harness:
        yield harness


@pytest.fixture
def inproc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """For what does not depend on the transport: the in-process server only."""
    with own_harness("inproc", tmp_path, monkeypatch) as harness:
        yield harness


@pytest.fixture
def stdio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-auto", tmp_path, monkeypatch) as harness:
        yield harness


@contextlib.asynccontextmanager
async def connect(harness: Harness, *, opt_in: bool = True, mode: str = "auto",
                  config: Path | None = None) -> AsyncIterator[Client]:
    """A client of the harness's transport that advertises the extension (or not)."""
    extensions = [TasksClientExtension()] if opt_in else []
    config = config or harness.write_config({})
    if harness.transport == "inproc":
        from gateway.config import load_settings
        from gateway.mcp.server import build_server

        harness.monkeypatch.setenv("HOME", str(harness.home))
        harness.monkeypatch.setenv("PATH", server_env(harness.home, config)["PATH"])
        async with Client(build_server(load_settings(config)), mode=mode,
                          extensions=extensions,
                          read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            yield client
    elif harness.transport.startswith("stdio"):
        params = StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                       env=server_env(harness.home, config),
                                       cwd=str(harness.home))
        async with Client(params, mode=mode, extensions=extensions,
                          read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            yield client
    else:
        server = harness.http_server({})
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                               timeout=httpx2.Timeout(30, read=120)) as http,
            Client(streamable_http_client(server.url, http_client=http),
                   mode=mode, extensions=extensions,
                   read_timeout_seconds=CLIENT_TIMEOUT_S) as client,
        ):
            yield client


async def poll_until_done(client: Client, task_id: str) -> dict[str, Any]:
    while True:
        task = await send(client, "tasks/get", task_id)
        assert task["resultType"] == "complete"
        assert task["taskId"] == task_id
        if task["status"] != "working":
            return task
        await anyio.sleep(0.05)


async def test_a_tasked_request_is_working_at_once_and_its_result_is_the_sync_answer(
        harness: Harness) -> None:
    prompt = f"tasked {tag()} @sleep=1"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            created = await call_as_task(client, "claude_request", {"prompt": prompt})
            assert isinstance(created, CreatedTask), created
            assert created.status == "working"
            assert created.poll_interval_ms and created.poll_interval_ms > 0
            # ttlMs follows retention (30 days by default), counted from creation.
            assert created.ttl_ms is not None and created.ttl_ms >= 30 * 86_400_000
            assert created.created_at.endswith("Z")
            # Durable before the answer: the same id is a job every tool can see.
            status = await client.call_tool("llm_job_status", {"job_id": created.task_id})
            assert status.structured_content is not None
            assert status.structured_content["status"] in {"queued", "running"}

            task = await poll_until_done(client, created.task_id)
            assert task["status"] == "completed"
            assert "completed" in task["statusMessage"]
            result = task["result"]
            assert result["isError"] is False
            assert result["content"][0]["text"].strip() == f"fake-claude answer: {prompt}"
            # Exactly the sync tool's answer for that job: an identical plain call joins
            # the finished job (dedup) and answers the same fields.
            plain = await client.call_tool("claude_request", {"prompt": prompt})
            assert plain.structured_content is not None
            assert plain.structured_content["job_id"] == created.task_id
            assert plain.content[0].text == result["content"][0]["text"]  # type: ignore[union-attr]
            same = {k: v for k, v in plain.structured_content.items() if k != "deduplicated"}
            assert same == {k: v for k, v in result["structuredContent"].items()
                            if k != "deduplicated"}


async def test_a_running_task_says_how_long_and_how_much_output(inproc: Harness) -> None:
    harness = inproc
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            created = await call_as_task(client, "codex_request",
                                         {"prompt": f"slow {tag()} @stream=40:0.05 @sleep=3"})
            assert isinstance(created, CreatedTask)
            while True:
                task = await send(client, "tasks/get", created.task_id)
                message = task["statusMessage"]
                if "running for" in message and "bytes of output so far" in message:
                    break
                assert task["status"] == "working", task
                await anyio.sleep(0.05)
            await send(client, "tasks/cancel", created.task_id)


async def test_cancelling_a_task_kills_its_run_and_ends_it_cancelled(harness: Harness) -> None:
    marker = tag()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            created = await call_as_task(client, "gemini_request",
                                         {"prompt": f"long {marker} @sleep=30"})
            assert isinstance(created, CreatedTask)
            pid = await spawned_pid(harness, marker)
            ack = await send(client, "tasks/cancel", created.task_id)
            assert ack["resultType"] == "complete"
            assert set(ack) <= {"resultType", "_meta"}  # an empty acknowledgement
            task = await poll_until_done(client, created.task_id)
            assert task["status"] == "cancelled"
            assert "result" not in task
            # Cancelling again, or a finished task, is still just acknowledged.
            await send(client, "tasks/cancel", created.task_id)
    assert not alive(pid)


async def test_a_failed_run_is_a_completed_task_whose_result_is_an_error(
        harness: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            created = await call_as_task(client, "claude_request",
                                         {"prompt": f"who {tag()} @auth"})
            assert isinstance(created, CreatedTask)
            task = await poll_until_done(client, created.task_id)
            assert task["status"] == "completed"
            assert "error" not in task
            result = task["result"]
            assert result["isError"] is True
            assert result["structuredContent"]["error_kind"] == "auth"
            assert result["structuredContent"]["status"] == "failed"


async def test_tasks_update_acknowledges_and_ignores_unknown_keys(inproc: Harness) -> None:
    harness = inproc
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            created = await call_as_task(client, "devin_request", {"prompt": f"u {tag()}"})
            assert isinstance(created, CreatedTask)
            ack = await send(client, "tasks/update", created.task_id,
                             inputResponses={"never-asked": {"action": "accept"}},
                             somethingElse=1)
            assert ack["resultType"] == "complete"
            assert (await poll_until_done(client, created.task_id))["status"] == "completed"


async def test_unknown_task_ids_are_invalid_params_and_legacy_only_methods_are_absent(
        harness: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            for method in ("tasks/get", "tasks/update", "tasks/cancel"):
                with pytest.raises(MCPError) as caught:
                    await send(client, method, "no-such-task", inputResponses={})
                assert caught.value.error.code == -32602, method
                assert "not found" in caught.value.error.message.lower()
            # Removed by the extension: tasks/result and tasks/list are not served at 2026.
            with pytest.raises(MCPError) as missing:
                await send(client, "tasks/result", "no-such-task")
            assert missing.value.error.code == -32601


async def test_a_client_that_does_not_opt_in_gets_the_plain_answer_and_no_task_methods(
        harness: Harness) -> None:
    prompt = f"plain {tag()}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness, opt_in=False) as client:
            result = await client.call_tool("mistral_request", {"prompt": prompt})
            assert not result.is_error
            assert result.structured_content is not None
            assert result.structured_content["text"].strip() == f"fake-mistral answer: {prompt}"
            with pytest.raises(MCPError) as caught:
                await send(client, "tasks/get", result.structured_content["job_id"])
            assert caught.value.error.code == -32021
            assert caught.value.error.data == {
                "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


async def test_a_legacy_handshake_client_with_the_extension_gets_the_plain_answer(
        harness: Harness) -> None:
    prompt = f"legacy {tag()}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness, mode="legacy") as client:
            result = await call_as_task(client, "grok_request", {"prompt": prompt})
            assert not isinstance(result, CreatedTask)
            assert result.structured_content["text"].strip() == f"fake-grok answer: {prompt}"


async def test_only_the_sync_request_tools_become_tasks(inproc: Harness) -> None:
    harness = inproc
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            started = await call_as_task(client, "claude_request_async", {"prompt": f"a {tag()}"})
            assert not isinstance(started, CreatedTask)
            job_id = started.structured_content["job_id"]
            waited = await call_as_task(client, "llm_job_wait", {"job_id": job_id})
            assert not isinstance(waited, CreatedTask)
            # A refusal before any job existed is the plain isError answer, not a task.
            bad = await call_as_task(client, "claude_request", {"prompt": "   "})
            assert not isinstance(bad, CreatedTask)
            assert bad.is_error
            assert bad.structured_content["error_kind"] == "invalid_input"


async def test_the_server_advertises_the_extension(inproc: Harness) -> None:
    harness = inproc
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness) as client:
            discovered = client.session.server_capabilities
            assert discovered is not None
            assert discovered.extensions is not None
            assert "io.modelcontextprotocol/tasks" in discovered.extensions


def test_every_task_method_over_http_needs_the_bearer_token(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    (tmp_path / "home").mkdir()
    harness = Harness("http", tmp_path, monkeypatch)
    try:
        server = harness.http_server({})
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {
                    "extensions": {"io.modelcontextprotocol/tasks": {}}}}
        with httpx2.Client(timeout=scaled(10)) as http:
            for method in ("tasks/get", "tasks/update", "tasks/cancel", "tasks/result",
                           "tasks/list"):
                body = {"jsonrpc": "2.0", "id": 1, "method": method,
                        "params": {"taskId": "x", "inputResponses": {}, "_meta": meta}}
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    answer = http.post(server.url, json=body,
                                       headers={**MODERN_HEADERS, **headers,
                                                "Mcp-Method": method, "Mcp-Name": "x"})
                    assert answer.status_code == 401, (method, headers)
                answer = http.post(server.url, json=body,
                                   headers={**MODERN_HEADERS, "Authorization": f"Bearer {TOKEN}",
                                            "Mcp-Method": method, "Mcp-Name": "x"})
                assert answer.status_code != 401, method
    finally:
        harness.close()


def envelope(*extensions: str) -> dict[str, Any]:
    """A 2026-07-28 request's `_meta`: its own version, identity and capabilities."""
    return {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw-modern-test", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {
                "extensions": {name: {} for name in extensions}}}


async def test_the_opt_in_is_read_from_each_request_never_from_an_earlier_one(
        stdio: Harness) -> None:
    harness = stdio
    ext = "io.modelcontextprotocol/tasks"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(harness) as client:
            tasked = await client.result("tools/call", {
                "name": "codex_request", "arguments": {"prompt": f"one {tag()}"},
                "_meta": envelope(ext)})
            assert tasked["resultType"] == "task"
            # The same connection, the next request without the extension: no task.
            plain = await client.result("tools/call", {
                "name": "codex_request", "arguments": {"prompt": f"two {tag()}"},
                "_meta": envelope()})
            assert plain["resultType"] == "complete"
            assert plain["content"][0]["text"].startswith("fake-codex answer: two")
            refused = await client.request("tasks/get", {"taskId": tasked["taskId"],
                                                         "_meta": envelope()})
            assert refused["error"]["code"] == -32021
            task = await client.result("tasks/get", {"taskId": tasked["taskId"],
                                                     "_meta": envelope(ext)})
            assert task["taskId"] == tasked["taskId"]


async def test_a_queued_task_says_where_it_waits(inproc: Harness) -> None:
    harness = inproc
    config = harness.write_config({"limits": {"max_running_per_provider": 1}})
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with connect(harness, config=config) as client:
            first = await call_as_task(client, "grok_request", {"prompt": f"a {tag()} @sleep=30"})
            second = await call_as_task(client, "grok_request", {"prompt": f"b {tag()}"})
            assert isinstance(first, CreatedTask) and isinstance(second, CreatedTask)
            assert second.status == "working"
            assert second.status_message is not None
            assert "queued (position 1)" in second.status_message
            await send(client, "tasks/cancel", first.task_id)
            assert (await poll_until_done(client, second.task_id))["status"] == "completed"
