"""The experimental tasks of protocol 2025-11-25 (SEP-1686), through clients this project
did not write: the TypeScript MCP SDK's experimental tasks client (`callToolStream`,
`getTask`, `getTaskResult`, `listTasks`, `cancelTask`), and JSON-RPC spoken directly for
the rest (the SDK's Python client cannot receive a 2025-11-25 CreateTaskResult)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.mcp.tasks_legacy import LIST_PAGE_SIZE
from tests.conftest import in_ci
from tests.mcp.conftest import REPO, Harness, own_harness, server_env
from tests.mcp.task_client import RawStdioClient, raw_stdio
from tests.mcp.test_tools import alive, fake_spawns, tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
TS_CLIENT = REPO / "tests" / "clients" / "ts_tasks_client.mjs"
TS_SDK = Path(os.environ.get("TS_MCP_SDK_PREFIX", REPO / ".tools" / "ts-mcp-sdk"))
TS_SDK_MANIFEST = TS_SDK / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
TASKS_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        yield harness


def node() -> str:
    """node and the TypeScript SDK (scripts/install-ts-mcp-sdk.sh); skip locally when
    missing, fail in CI (which installs them)."""
    found = shutil.which("node")
    if found is None or not TS_SDK_MANIFEST.exists():
        message = ("node or the TypeScript MCP SDK is missing: run "
                   "scripts/install-ts-mcp-sdk.sh")
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def run_ts_client(harness: Harness, scenario: str, prompt: str) -> dict[str, dict[str, Any]]:
    config = harness.write_config({})
    env = server_env(harness.home, config)
    completed = subprocess.run(
        [node(), str(TS_CLIENT), scenario, sys.executable, json.dumps(env), str(harness.home),
         prompt],
        env={"PATH": os.environ.get("PATH", os.defpath), "TS_MCP_SDK": str(TS_SDK),
             "HOME": str(harness.home)},
        capture_output=True, text=True, timeout=scaled(TEST_TIMEOUT_S), check=False)
    assert completed.returncode == 0, completed.stderr
    steps = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    return {step.pop("step"): step for step in steps}


def test_the_typescript_client_streams_a_task_to_the_real_answer(harness: Harness) -> None:
    prompt = f"ts stream {tag()} @sleep=0.5"
    steps = run_ts_client(harness, "stream", prompt)
    assert steps["connected"]["tasks"] == TASKS_CAPABILITY
    # Only the sync request tools may become tasks; the async ones answer at once anyway.
    assert steps["tools"]["claudeRequest"] == {"taskSupport": "optional"}
    assert steps["tools"]["claudeRequestAsync"] is None

    messages = steps["stream"]["messages"]
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", kinds
    created = messages[0]["task"]
    assert created["status"] == "working"
    assert created["ttl"] >= 30 * 86_400_000 and created["pollInterval"] > 0
    result = messages[-1]["result"]
    assert result["isError"] is False
    assert result["content"][0]["text"].strip() == f"fake-claude answer: {prompt}"
    assert result["structuredContent"]["job_id"] == created["taskId"]
    assert "resultType" not in result
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {
        "taskId": created["taskId"]}

    assert created["taskId"] in steps["list"]["taskIds"]
    assert steps["unknown"]["code"] == -32602
    # Without `task` the same tool answers as always.
    plain = steps["plain"]["result"]
    assert plain["isError"] is False
    assert plain["content"][0]["text"].strip() == f"fake-claude answer: {prompt} again"


def test_the_typescript_client_cancels_a_task_and_its_run_dies(harness: Harness) -> None:
    marker = tag()
    steps = run_ts_client(harness, "cancel", f"long {marker} @stream=600:0.05")
    task_id = steps["created"]["task"]["taskId"]
    assert steps["cancelled"]["task"]["taskId"] == task_id
    assert steps["after"]["task"]["status"] == "cancelled"
    result = steps["result"]["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error_kind"] == "cancelled"
    spawns = fake_spawns(harness.fake_log, marker)
    assert spawns and not alive(spawns[0]["pid"])


@contextlib.asynccontextmanager
async def raw_legacy(harness: Harness) -> AsyncIterator[RawStdioClient]:
    async with raw_stdio(harness) as client:
        init = await client.result("initialize", {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw-legacy-test", "version": "0"}})
        assert init["protocolVersion"] == "2025-11-25"
        assert init["capabilities"]["tasks"] == TASKS_CAPABILITY
        await client.notify("notifications/initialized")
        yield client


async def create_legacy_task(client: RawStdioClient, tool: str,
                             args: dict[str, Any]) -> dict[str, Any]:
    return await client.request("tools/call", {"name": tool, "arguments": args,
                                               "task": {"ttl": 60_000}})


async def test_a_legacy_task_of_a_failed_run_completes_with_an_error_result(
        harness: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_legacy(harness) as client:
            created = await create_legacy_task(client, "codex_request",
                                               {"prompt": f"who {tag()} @auth"})
            task_id = created["result"]["task"]["taskId"]
            while (task := await client.result("tasks/get", {"taskId": task_id})
                   )["status"] == "working":
                await anyio.sleep(0.05)
            assert task["status"] == "completed"
            assert set(task) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl",
                                 "pollInterval", "statusMessage"}
            result = await client.result("tasks/result", {"taskId": task_id})
            assert result["isError"] is True
            assert result["structuredContent"]["error_kind"] == "auth"


async def test_legacy_refusals_and_unknown_ids_are_json_rpc_errors(harness: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_legacy(harness) as client:
            refused = await create_legacy_task(client, "claude_request", {"prompt": "   "})
            assert refused["error"]["code"] == -32602
            assert "prompt" in refused["error"]["message"]
            for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/update"):
                unknown = await client.request(method, {"taskId": "no-such-task",
                                                        "inputResponses": {}})
                assert unknown["error"]["code"] == -32602, method
            bad_cursor = await client.request("tasks/list", {"cursor": "not-a-cursor"})
            assert bad_cursor["error"]["code"] == -32602


async def test_tasks_list_pages_newest_first(harness: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_legacy(harness) as client:
            ids = []
            for n in range(LIST_PAGE_SIZE + 2):
                created = await create_legacy_task(client, "devin_request",
                                                   {"prompt": f"list {n} {tag()}"})
                ids.append(created["result"]["task"]["taskId"])
            first = await client.result("tasks/list")
            assert [t["taskId"] for t in first["tasks"]] == ids[::-1][:LIST_PAGE_SIZE]
            assert all(t["status"] in {"working", "completed"} for t in first["tasks"])
            second = await client.result("tasks/list", {"cursor": first["nextCursor"]})
            assert [t["taskId"] for t in second["tasks"]] == ids[::-1][LIST_PAGE_SIZE:]
            assert "nextCursor" not in second


async def test_a_legacy_task_notifies_its_connection_when_it_ends(harness: Harness) -> None:
    prompt = f"notify {tag()} @sleep=0.3"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_legacy(harness) as client:
            created = await create_legacy_task(client, "grok_request", {"prompt": prompt})
            task_id = created["result"]["task"]["taskId"]
            note = await client.notification("notifications/tasks/status")
            params = note["params"]
            assert params["taskId"] == task_id
            assert params["status"] == "completed"
            assert params["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
            result = await client.result("tasks/result", {"taskId": task_id})
            assert result["content"][0]["text"].strip() == f"fake-grok answer: {prompt}"
