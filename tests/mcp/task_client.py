"""The SDK's own Python client speaking the tasks extension: a small ClientExtension that
advertises `io.modelcontextprotocol/tasks` per request, plus the `tasks/*` requests.

Not a reimplementation of a task client: the wire models are the spec's shapes, sent with
the SDK's `ClientSession.send_request`, so a test sees exactly what the server answered.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

import anyio
import mcp_types
from anyio.abc import Process
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, RequestParams, Result
from pydantic import ConfigDict, Field

from tests.mcp.conftest import Harness, server_env
from tests.mcp.test_tools import fake_spawns

EXTENSION_ID = "io.modelcontextprotocol/tasks"


class CreatedTask(Result):
    """`CreateTaskResult` as it arrives (the flat task fields, `resultType: "task"`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    status_message: str | None = Field(default=None, alias="statusMessage")


class AnyResult(Result):
    model_config = ConfigDict(extra="allow")


class TaskIdParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    task_id: str = Field(serialization_alias="taskId")


class GetTask(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams


class CancelTask(mcp_types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


class UpdateTask(mcp_types.Request[TaskIdParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TaskIdParams


class ResultTask(mcp_types.Request[TaskIdParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: TaskIdParams


class TasksClientExtension(ClientExtension):
    """Advertises the extension. `call_as_task` reads the raw CreateTaskResult; a plain
    `call_tool` that became a task is resolved by polling `tasks/get` at the server's
    `pollIntervalMs` (capped, to keep tests quick), as the spec's clients do."""

    identifier = EXTENSION_ID

    def claims(self) -> Sequence[ResultClaim[Any]]:
        async def resolve(created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
            while True:
                params = TaskIdParams(task_id=created.task_id)
                task = (await ctx.session.send_request(GetTask(params=params), AnyResult)
                        ).model_dump(by_alias=True, exclude_none=True)
                if task["status"] == "completed":
                    return CallToolResult.model_validate(task["result"])
                if task["status"] != "working":
                    raise AssertionError(f"task ended {task['status']}: {task}")
                await anyio.sleep(min(task.get("pollIntervalMs", 100), 100) / 1000)

        return (ResultClaim(result_type="task", model=CreatedTask, resolve=resolve),)


async def call_as_task(client: Client, tool: str, args: dict[str, Any]) -> Any:
    """tools/call with the opt-in; the raw CreateTaskResult (or the plain result)."""
    return await client.session.call_tool(tool, args, allow_claimed=True)


async def send(client: Client, method: str, task_id: str, **extra: Any) -> dict[str, Any]:
    request: Any = {"tasks/get": GetTask, "tasks/cancel": CancelTask,
                    "tasks/update": UpdateTask, "tasks/result": ResultTask}[method]
    params = TaskIdParams(task_id=task_id, **extra)
    result = await client.session.send_request(request(params=params), AnyResult)
    return result.model_dump(by_alias=True, exclude_none=True)


async def spawned_pid(harness: Harness, marker: str) -> int:
    """The pid of the fake CLI run whose prompt has `marker`, once it has started."""
    while not fake_spawns(harness.fake_log, marker):
        await anyio.sleep(0.05)
    return int(fake_spawns(harness.fake_log, marker)[0]["pid"])


class RawStdioClient:
    """JSON-RPC spoken directly over the gateway's stdio: what the SDK's client cannot
    send or receive (a 2025-11-25 CreateTaskResult, which it validates as a
    CallToolResult; a 2026 request whose capabilities differ from the one before)."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.next_id = 0
        self.buffer = b""
        self.notifications: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.answer(await self.start(method, params))

    async def start(self, method: str, params: dict[str, Any] | None = None) -> int:
        """Send a request without waiting for its answer (a listen's answer ends its stream);
        its id, for `answer`."""
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method,
                   "params": params or {}}
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(message).encode() + b"\n")
        return self.next_id

    async def answer(self, request_id: int) -> dict[str, Any]:
        """The answer to request `request_id`; notifications read meanwhile are kept."""
        return await self._take(self.answers, lambda m: m.get("id") == request_id)

    async def notify(self, method: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps({"jsonrpc": "2.0", "method": method}).encode()
                                      + b"\n")

    async def notification(self, method: str) -> dict[str, Any]:
        """The oldest notification of `method` not taken yet (waiting for one if need be)."""
        return await self._take(self.notifications, lambda m: m.get("method") == method)

    async def _take(self, kept: list[dict[str, Any]],
                    wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The oldest message of `kept` that is `wanted`, reading (and keeping answers and
        notifications apart) until one comes."""
        while True:
            for message in kept:
                if wanted(message):
                    kept.remove(message)
                    return message
            message = await self.read()
            (self.answers if "id" in message else self.notifications).append(message)

    async def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self.buffer:
            self.buffer += await self.process.stdout.receive()
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    async def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = await self.request(method, params)
        assert "result" in answer, answer
        return answer["result"]  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def raw_stdio(harness: Harness) -> AsyncIterator[RawStdioClient]:
    """`python -m gateway` with its own config, spoken to as RawStdioClient."""
    config = harness.write_config({})
    async with await anyio.open_process(
            [sys.executable, "-m", "gateway"], env=server_env(harness.home, config),
            cwd=str(harness.home), stderr=subprocess.DEVNULL) as process:
        try:
            yield RawStdioClient(process)
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.move_on_after(10):
                await process.wait()
