"""#23 item 4: MCP tasks and llm_job_* are bound to who made them.

Two HTTP gateways with different bearer tokens share one store (SQLite, then PostgreSQL);
each session is real Streamable HTTP. A job made through one token is `not found` through
the other (llm_job_status/result/wait/cancel, tasks/get, tasks/result, tasks/cancel), is
left out of its llm_job_list and tasks/list, and a cancel through the other token does not
touch it; through its own token everything works.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.config import load_settings
from gateway.mcp.principal import LOCAL, may_see, principal_of
from gateway.mcp.tasks_legacy import LIST_PAGE_SIZE
from gateway.model import JobRow, JobStatus, NewJob
from gateway.store import open_store
from tests.mcp.conftest import Harness, free_port, own_harness, start_http_server
from tests.mcp.test_tools import tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 120.0
TOKEN_A = "token-of-alice-" + "a" * 20
TOKEN_B = "token-of-bob-" + "b" * 20
HEADERS = {"Accept": "application/json, text/event-stream",
           "Content-Type": "application/json"}



@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-auto", tmp_path, monkeypatch) as harness:
        yield harness


class Session:
    """One raw Streamable HTTP session at protocol 2025-11-25 (tasks are methods there)."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str) -> None:
        self.http, self.url = http, url
        self.headers = dict(HEADERS, Authorization=f"Bearer {token}")
        self.next_id = 0

    async def request(self, method: str, params: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        answer = await self.http.post(self.url, content=json.dumps(body), headers=self.headers)
        assert answer.status_code == 200, answer.text
        if "mcp-session-id" in answer.headers:
            self.headers["mcp-session-id"] = answer.headers["mcp-session-id"]
        text = answer.text
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            text = next(line[len("data: "):] for line in text.splitlines()
                        if line.startswith("data: "))
        message: dict[str, Any] = json.loads(text)
        return message

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        message = await self.request("tools/call", {"name": name, "arguments": arguments})
        result: dict[str, Any] = message["result"]
        return result


@contextlib.asynccontextmanager
async def session(url: str, token: str) -> AsyncIterator[Session]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=90)) as http:
        opened = Session(http, url, token)
        init = await opened.request("initialize", {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "principal-test", "version": "0"}})
        assert "result" in init, init
        notified = await http.post(url, headers=opened.headers, content=json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}))
        assert notified.status_code == 202
        yield opened


def is_not_found(result: dict[str, Any]) -> bool:
    return bool(result.get("isError")) and (
        result.get("structuredContent") or {}).get("error_kind") == "job_not_found"


async def test_tasks_and_jobs_of_another_token_are_not_found(
        harness: Harness, store_config: dict[str, Any]) -> None:
    config = harness.write_config(store_config)
    alice = start_http_server(harness.home, config, free_port(), token=TOKEN_A)
    bob = start_http_server(harness.home, config, free_port(), token=TOKEN_B)
    try:
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with session(alice.url, TOKEN_A) as a, session(bob.url, TOKEN_B) as b:
                started = await a.tool("claude_request_async",
                                       {"prompt": f"long {tag()} @sleep=30"})
                job_id = started["structuredContent"]["job_id"]
                task = await a.request("tools/call", {
                    "name": "claude_request", "task": {"ttl": 60_000},
                    "arguments": {"prompt": f"task {tag()}"}})
                task_id = task["result"]["task"]["taskId"]

                for name, args in (("llm_job_status", {"job_id": job_id}),
                                   ("llm_job_result", {"job_id": job_id}),
                                   ("llm_job_wait", {"job_id": job_id, "timeout_s": 0}),
                                   ("llm_job_cancel", {"job_id": job_id}),
                                   ("llm_job_status", {"job_id": task_id})):
                    assert is_not_found(await b.tool(name, args)), name
                listed = (await b.tool("llm_job_list", {}))["structuredContent"]
                assert not {job_id, task_id} & {j["job_id"] for j in listed["jobs"]}
                for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                    refused = await b.request(method, {"taskId": task_id})
                    assert "error" in refused and "not found" in refused["error"]["message"]
                tasks = (await b.request("tasks/list"))["result"]["tasks"]
                assert not {job_id, task_id} & {t["taskId"] for t in tasks}

                # Its own token sees everything, and bob's cancel touched nothing.
                mine = (await a.tool("llm_job_status", {"job_id": job_id}))["structuredContent"]
                assert mine["status"] in ("queued", "running") and not mine["cancel_requested"]
                own = (await a.request("tasks/list"))["result"]["tasks"]
                assert {job_id, task_id} <= {t["taskId"] for t in own}
                assert "result" in await a.request("tasks/get", {"taskId": task_id})
                ids = {j["job_id"] for j in
                       (await a.tool("llm_job_list", {}))["structuredContent"]["jobs"]}
                assert {job_id, task_id} <= ids
                cancelled = await a.tool("llm_job_cancel", {"job_id": job_id})
                assert not cancelled.get("isError"), cancelled
    finally:
        alice.stop()
        bob.stop()


def test_a_row_from_before_schema_4_is_visible_to_local_only() -> None:
    old = JobRow(id="j", provider="claude", status=JobStatus.COMPLETED, request_key="k")
    assert may_see(LOCAL, old)
    assert not may_see(principal_of(TOKEN_A), old)
    mine = JobRow(id="j", provider="claude", status=JobStatus.COMPLETED, request_key="k",
                  principal=principal_of(TOKEN_A))
    assert may_see(principal_of(TOKEN_A), mine)
    assert not may_see(principal_of(TOKEN_B), mine) and not may_see(LOCAL, mine)
    assert TOKEN_A not in principal_of(TOKEN_A)  # only a hash is stored


async def test_a_page_of_llm_job_list_and_tasks_list_is_full_when_another_token_is_newer(
        harness: Harness, store_config: dict[str, Any]) -> None:
    """#23: the listings filtered other principals' jobs after the store's limit, so a
    caller whose jobs were older than another's page came back short or empty."""
    config = harness.write_config(store_config)
    alice = start_http_server(harness.home, config, free_port(), token=TOKEN_A)
    try:
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with session(alice.url, TOKEN_A) as a:
                started = await a.tool("claude_request_async", {"prompt": f"old {tag()}"})
                job_id = started["structuredContent"]["job_id"]
                # More of bob's jobs than a tasks/list page, all newer than alice's.
                await insert_jobs(config, principal_of(TOKEN_B), LIST_PAGE_SIZE + 5)

                listed = (await a.tool("llm_job_list", {"limit": 1}))["structuredContent"]
                assert [j["job_id"] for j in listed["jobs"]] == [job_id]
                tasks = (await a.request("tasks/list"))["result"]
                assert [t["taskId"] for t in tasks["tasks"]] == [job_id]
                assert "nextCursor" not in tasks
    finally:
        alice.stop()


async def insert_jobs(config: Path, principal: str, count: int) -> None:
    """`count` queued rows of `principal` straight into the shared store (another
    host's, so no gateway here adopts or runs them)."""
    settings = load_settings(config)
    store = await open_store(settings)
    try:
        for _ in range(count):
            await store.insert_job(NewJob(
                id=str(uuid.uuid4()), provider="claude", request_key=uuid.uuid4().hex,
                owner_instance="elsewhere", hostname="another-host", boot_id="boot",
                principal=principal), 60.0)
    finally:
        await store.close()
