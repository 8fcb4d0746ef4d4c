"""The experimental tasks of protocol 2025-11-25 (SEP-1686) on the same job table.

Not wire-compatible with the 2026 extension (tasks.py), so its pieces live here:
- a server middleware (the SDK's public `MCPServer(middleware=...)`), because on a
  handshake connection the SDK sieves every `tools/call` result through `CallToolResult`
  after an extension interceptor returns, which would strip a `CreateTaskResult`. The
  middleware sits above that sieve: it answers `tools/call` with `params.task` by
  `{task: ...}`, adds the `tasks` capability to the `initialize` answer and
  `execution.taskSupport: "optional"` to each `<provider>_request` in `tools/list`;
- `notifications/tasks/status` when a task created on this connection ends, sent on the
  connection's own channel (stdio, or an HTTP session's standing stream) if it still
  carries notifications; clients poll `tasks/get` regardless;
- `tasks/result` (waits until the job is terminal, bounded like `llm_job_wait`) and
  `tasks/list` (paged, this store's recent jobs), bound by TasksExtension (tasks.py) for
  2025-11-25 only; `tasks/get` and `tasks/cancel` are shared with the extension and answered in the
  2025-11-25 shape by `legacy_fields`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container, Mapping
from typing import TYPE_CHECKING, Any, cast

import structlog
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.types import (
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    PaginatedRequestParams,
    TaskStatusNotification,
    TaskStatusNotificationParams,
)
from pydantic import ConfigDict

from gateway.mcp.admission import MAX_WAIT_S
from gateway.mcp.principal import visible_jobs
from gateway.mcp.server_state import ServerState
from gateway.mcp.task_state import (
    LEGACY_TASKS_VERSION,
    TaskIdParams,
    TaskView,
    admit_as_task,
    load_task,
    task_error,
    task_result,
    view,
)
from gateway.model import GatewayError

if TYPE_CHECKING:
    from gateway.jobs.manager import JobManager

log = structlog.get_logger(__name__)

RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
# tasks/result blocks until the task is terminal, bounded like llm_job_wait: under the
# common 60 s client request timeout. A task still working then gets an error saying to
# ask again (the clients poll tasks/get first and ask for the result once it is terminal).
RESULT_WAIT_S = MAX_WAIT_S
# A status watcher re-checks in slices this long, so it notices a gateway that stops.
WATCH_STEP_S = 5.0
LIST_PAGE_SIZE = 50
LIST_MAX_TASKS = 500  # how far back tasks/list pages: the store keeps more, llm_job_list reads it
TASKS_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}

Handler = Callable[[ServerRequestContext[Any, Any], Any], Awaitable[dict[str, Any]]]


class ListParams(PaginatedRequestParams):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


def legacy_fields(task: TaskView) -> dict[str, Any]:
    """The 2025-11-25 `Task`: `ttl` and `pollInterval` instead of `ttlMs`, `pollIntervalMs`."""
    fields = task.fields()
    fields["ttl"] = fields.pop("ttlMs")
    fields["pollInterval"] = fields.pop("pollIntervalMs")
    return fields


class LegacyTasksMiddleware:
    """The parts of 2025-11-25 tasks that must shape a core method's answer."""

    def __init__(self, state: ServerState, task_tools: Container[str]) -> None:
        self.state = state
        self.task_tools = task_tools
        self._watchers: set[asyncio.Task[None]] = set()

    async def __call__(self, ctx: ServerRequestContext[Any, Any],
                       call_next: CallNext) -> HandlerResult:
        if ctx.method == "initialize":
            return _with_tasks_capability(await call_next(ctx))
        if ctx.protocol_version != LEGACY_TASKS_VERSION:
            return await call_next(ctx)  # other versions: nothing of this applies
        if ctx.method == "tools/list":
            return self._with_task_support(await call_next(ctx))
        if ctx.method == "tools/call" and self._wants_task(ctx.params):
            return await self._create(ctx, call_next)
        return await call_next(ctx)

    def _wants_task(self, params: Mapping[str, Any] | None) -> bool:
        return (params is not None and isinstance(params.get("task"), dict)
                and params.get("name") in self.task_tools)

    async def _create(self, ctx: ServerRequestContext[Any, Any],
                      call_next: CallNext) -> dict[str, Any]:
        admission, result = await admit_as_task(ctx, call_next)
        if admission.submission is None:
            # The client waits for a CreateTaskResult; a refusal before any job existed
            # (bad arguments, saturated) is a JSON-RPC error carrying the tool's text.
            raise MCPError(code=INVALID_PARAMS, message=_text_of(result))
        manager = await self.state.manager()
        task = legacy_fields(view(manager, admission.submission.job))
        if task["status"] == "working":
            watcher = asyncio.create_task(_notify_when_done(ctx, manager, task["taskId"]),
                                          name=f"task-status-{task['taskId']}")
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)
        return {"task": task, "_meta": {RELATED_TASK_META_KEY: {"taskId": task["taskId"]}}}

    def _with_task_support(self, result: HandlerResult) -> HandlerResult:
        if not isinstance(result, dict):
            return result
        tools = [dict(t) if t.get("name") in self.task_tools else t
                 for t in result.get("tools", [])]
        for tool in tools:
            if tool.get("name") in self.task_tools:
                tool["execution"] = {**tool.get("execution", {}), "taskSupport": "optional"}
        return {**result, "tools": tools}


async def _notify_when_done(ctx: ServerRequestContext[Any, Any], manager: JobManager,
                            task_id: str) -> None:
    """Send `notifications/tasks/status` on the creating connection once the job ends.
    Best effort by design: the client polls anyway, so a closed connection, a stopping
    gateway or an unreachable store just ends the watch."""
    try:
        row = await manager.reads.wait_end(task_id, WATCH_STEP_S,
                                           stop=lambda: manager.closing)
        if row.status.is_active:
            return
        fields = legacy_fields(view(manager, row))
        params = TaskStatusNotificationParams.model_validate(
            {**fields, "_meta": {RELATED_TASK_META_KEY: {"taskId": task_id}}})
        notification = TaskStatusNotification(method="notifications/tasks/status",
                                              params=params)
        # Not in the SDK's ServerNotification union (it has no server-side tasks): sent
        # as the typed model all the same, which is all send_notification dumps.
        await ctx.session.send_notification(cast(Any, notification))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the connection closed, the store went away: the watch ends
        log.debug("task status not notified", action="task_status_notify", task_id=task_id,
                  error=repr(exc))


def _with_tasks_capability(result: HandlerResult) -> HandlerResult:
    """Advertise the tasks capability to a client that negotiated 2025-11-25 (the only
    handshake version that knows it)."""
    if not isinstance(result, dict) or result.get("protocolVersion") != LEGACY_TASKS_VERSION:
        return result
    capabilities = dict(result.get("capabilities") or {})
    capabilities["tasks"] = TASKS_CAPABILITY
    return {**result, "capabilities": capabilities}


def _text_of(result: HandlerResult) -> str:
    content = result.get("content") if isinstance(result, dict) else None
    texts = [c.get("text", "") for c in content or [] if isinstance(c, dict)]
    return " ".join(t for t in texts if t) or "The request was refused."


def result_handler(state: ServerState) -> Handler:
    async def tasks_result(ctx: ServerRequestContext[Any, Any],
                           params: TaskIdParams) -> dict[str, Any]:
        manager, _ = await load_task(state, params.task_id)
        try:
            row = await manager.reads.wait(params.task_id, RESULT_WAIT_S)
        except GatewayError as err:
            raise task_error(err) from None
        if row.status.is_active:
            raise MCPError(code=REQUEST_TIMEOUT,
                           message=f"Task {row.id} is still working after {RESULT_WAIT_S:g} s; "
                                   f"poll tasks/get and call tasks/result again once it is "
                                   f"terminal.")
        result = await task_result(manager.reads, row)
        result.pop("resultType", None)  # 2026 vocabulary: no such key at 2025-11-25
        meta = dict(result.get("_meta") or {})
        meta[RELATED_TASK_META_KEY] = {"taskId": row.id}
        return {**result, "_meta": meta}

    return tasks_result


def list_handler(state: ServerState) -> Handler:
    async def tasks_list(ctx: ServerRequestContext[Any, Any],
                         params: ListParams) -> dict[str, Any]:
        start = _cursor_offset(params.cursor)
        try:
            manager = await state.manager()
            rows = await visible_jobs(manager.reads, state.principal,
                                      limit=min(LIST_MAX_TASKS, start + LIST_PAGE_SIZE + 1))
        except GatewayError as err:
            raise task_error(err) from None
        page = rows[start:start + LIST_PAGE_SIZE]
        data: dict[str, Any] = {"tasks": [legacy_fields(view(manager, r)) for r in page]}
        if len(rows) > start + LIST_PAGE_SIZE:
            data["nextCursor"] = str(start + LIST_PAGE_SIZE)
        return data

    return tasks_list


def _cursor_offset(cursor: str | None) -> int:
    """The cursor is the offset of the page in the newest-first list."""
    if cursor is None:
        return 0
    if not cursor.isdigit() or int(cursor) >= LIST_MAX_TASKS:
        raise MCPError(code=INVALID_PARAMS, message=f"Invalid tasks/list cursor {cursor!r}; "
                                                    f"pass a nextCursor from an earlier page.")
    return int(cursor)
