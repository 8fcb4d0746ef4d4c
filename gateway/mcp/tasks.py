"""MCP Tasks on the durable job table: the `io.modelcontextprotocol/tasks` extension.

A task *is* a job (task_state.py): the task id is the job id, `tasks/get` reads the row, and
the result is the sync tool's answer. So any gateway sharing the store answers `tasks/get`
for any task, after the client, the window or the gateway that created it are gone.

Two wire versions are served (docs/tools.md, MCP Tasks, summarizes both):
- protocol 2026-07-28, the extension (SEP-2663): a `tools/call` whose per-request client
  capabilities carry the extension gets a `CreateTaskResult` (`resultType: "task"`) once
  the row is durable; `tasks/get`, `tasks/update`, `tasks/cancel`. Built on the SDK's
  `Extension`: `intercept_tool_call` plus `MethodBinding`s.
- protocol 2025-11-25, the experimental tasks (SEP-1686): `params.task` on `tools/call`,
  `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel` (tasks_legacy.py).

`notifications/tasks` (the extension's push over `subscriptions/listen`) is task_listen.py.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.types import MISSING_REQUIRED_CLIENT_CAPABILITY, CallToolRequestParams
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from gateway.mcp import tasks_legacy
from gateway.mcp.server_state import ServerState
from gateway.mcp.task_state import (
    LEGACY_TASKS_VERSION,
    TaskIdParams,
    admit_as_task,
    detailed_task,
    load_task,
    task_error,
    view,
)
from gateway.model import GatewayError

EXTENSION_ID = "io.modelcontextprotocol/tasks"


class UpdateParams(TaskIdParams):
    """`tasks/update`: this product never asks for input, so every response is ignored."""

    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def opted_in(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether *this request* carries the extension in its client capabilities (the spec:
    never inferred from earlier requests; on the modern wire the SDK builds the session's
    capabilities from each request's own envelope)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return extensions is not None and EXTENSION_ID in extensions


def require_opt_in(ctx: ServerRequestContext[Any, Any]) -> None:
    """`tasks/*` from a modern client that did not declare the extension: -32021."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and not opted_in(ctx):
        raise MCPError(code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                       message="Missing required client capability",
                       data={"requiredCapabilities": {"extensions": {EXTENSION_ID: {}}}})


class TasksExtension(Extension):
    """The SEP-2663 extension, plus the shared `tasks/*` methods of 2025-11-25.

    `task_tools` names the tools that may become tasks: each provider's sync
    `<provider>_request` (the `_async` tools and `llm_job_*` answer at once anyway).
    """

    identifier = EXTENSION_ID

    def __init__(self, state: ServerState, task_tools: Container[str]) -> None:
        self.state = state
        self.task_tools = task_tools

    def methods(self) -> Sequence[MethodBinding]:
        legacy = frozenset({LEGACY_TASKS_VERSION})
        return (
            MethodBinding("tasks/get", TaskIdParams, self._get),
            MethodBinding("tasks/update", UpdateParams, self._update),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel),
            MethodBinding("tasks/result", TaskIdParams, tasks_legacy.result_handler(self.state),
                          protocol_versions=legacy),
            MethodBinding("tasks/list", tasks_legacy.ListParams,
                          tasks_legacy.list_handler(self.state), protocol_versions=legacy),
        )

    async def intercept_tool_call(self, params: CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        if params.name not in self.task_tools or not opted_in(ctx):
            return await call_next(ctx)  # not opted in: exactly the plain call
        admission, result = await admit_as_task(ctx, call_next)
        if admission.submission is None:
            return result
        manager = await self.state.manager()
        # The row the submission returned is durable (insert committed): a tasks/get on
        # any instance resolves it from here on.
        return {"resultType": "task", **view(manager, admission.submission.job).fields()}

    async def _get(self, ctx: ServerRequestContext[Any, Any],
                   params: TaskIdParams) -> dict[str, Any]:
        require_opt_in(ctx)
        manager, row = await load_task(self.state, params.task_id)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return tasks_legacy.legacy_fields(view(manager, row))
        return {"resultType": "complete", **await detailed_task(manager, row)}

    async def _update(self, ctx: ServerRequestContext[Any, Any],
                      params: UpdateParams) -> dict[str, Any]:
        require_opt_in(ctx)
        await load_task(self.state, params.task_id)  # unknown id: -32602
        return {"resultType": "complete"}  # nothing is ever asked: every key is unknown

    async def _cancel(self, ctx: ServerRequestContext[Any, Any],
                      params: TaskIdParams) -> dict[str, Any]:
        """`llm_job_cancel`: a local run is killed now, another instance's within about
        `lease.cancel_poll_s`; a finished job is left as it is."""
        require_opt_in(ctx)
        manager, _ = await load_task(self.state, params.task_id)
        try:
            outcome = await manager.cancel(params.task_id)
        except GatewayError as err:
            raise task_error(err) from None
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return tasks_legacy.legacy_fields(view(manager, outcome.job))
        return {"resultType": "complete"}


