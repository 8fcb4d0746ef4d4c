"""MCP Tasks on the durable job table: the `io.modelcontextprotocol/tasks` extension.

A task *is* a job: the task id is the job id, its state is the job row, and its result is
exactly the `CallToolResult` the sync `<provider>_request` returns for that job
(`tools.final_answer`). So any gateway sharing the store answers `tasks/get` for any task,
after the client, the window or the gateway that created it are gone, and nothing about a
task lives in this process.

Two wire versions are served (the reference notes in DESIGN section 6 summarize both):
- protocol 2026-07-28, the extension (SEP-2663): a `tools/call` whose per-request client
  capabilities carry the extension gets a `CreateTaskResult` (`resultType: "task"`) once
  the row is durable; `tasks/get`, `tasks/update`, `tasks/cancel`. Built on the SDK's
  `Extension`: `intercept_tool_call` plus `MethodBinding`s.
- protocol 2025-11-25, the experimental tasks (SEP-1686): `params.task` on `tools/call`,
  `tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel` (tasks_legacy.py).

`notifications/tasks` over `subscriptions/listen` is not served: the SDK owns
`subscriptions/listen` and its filter has no `taskIds`, so clients poll `tasks/get`
(at `pollIntervalMs`), which is what the extension's clients do anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.tools import Tool
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from gateway.mcp.tools import TASK_ADMISSION, ServerState, TaskAdmission, final_answer
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus

if TYPE_CHECKING:  # the job machinery loads after the handshake (startup stays light)
    from gateway.jobs.manager import JobManager

EXTENSION_ID = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"
LEGACY_TASKS_VERSION = "2025-11-25"  # the one handshake version that has (experimental) tasks
# Another instance's view of a running job is at most PROGRESS_FLUSH_S (2 s) stale and a
# remote wait re-reads the row once a second: polling faster than that learns nothing.
POLL_INTERVAL_MS = 1000
MS_PER_DAY = 86_400_000


class TaskIdParams(RequestParams):
    """`tasks/get`, `tasks/cancel`, `tasks/result`: the task id (other keys ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    task_id: str = Field(alias="taskId")


class UpdateParams(TaskIdParams):
    """`tasks/update`: this product never asks for input, so every response is ignored."""

    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


@dataclass(slots=True, frozen=True)
class TaskView:
    """A job row seen as a task, in the words both wire versions share."""

    row: JobRow
    status: str  # working | completed | cancelled
    status_message: str
    ttl_ms: int

    def fields(self) -> dict[str, Any]:
        """The 2026-07-28 `Task` fields (the 2025-11-25 shape renames two of them)."""
        return {"taskId": self.row.id, "status": self.status,
                "statusMessage": self.status_message,
                "createdAt": _stamp(self.row.created_at),
                "lastUpdatedAt": _stamp(_last_update(self.row)),
                "ttlMs": self.ttl_ms, "pollIntervalMs": POLL_INTERVAL_MS}


def request_tool_names(tools: Sequence[Tool]) -> frozenset[str]:
    """The tools that may become tasks: each provider's sync `<provider>_request`."""
    return frozenset(t.name for t in tools if t.name.endswith("_request"))


def task_status(row: JobRow) -> str:
    """queued/running -> working; cancelled -> cancelled; every other end -> completed.

    A run that failed, timed out or was orphaned still *answered* the tool call (an
    `isError` result, as the sync tool returns): that is a completed task. `failed` is
    reserved for JSON-RPC-level errors, which a stored job never has.
    """
    if row.status.is_active:
        return "working"
    return "cancelled" if row.status == JobStatus.CANCELLED else "completed"


def status_message(manager: JobManager, row: JobRow) -> str:
    """What a person wants to know: queued (position), running for N s, M bytes so far."""
    if row.status == JobStatus.QUEUED:
        position = manager.queue_position(row.id)
        if position is not None:
            return f"{row.provider} job queued (position {position}), waiting for a free run slot"
        if row.owner_instance == manager.instance_id:
            return f"{row.provider} job starting"
        return f"{row.provider} job queued on another gateway instance"
    if row.status == JobStatus.RUNNING:
        began = row.started_at or row.created_at
        elapsed = (datetime.now(UTC) - began).total_seconds() if began else 0.0
        return (f"{row.provider} job running for {max(0.0, elapsed):.0f} s, "
                f"{row.output_bytes} bytes of output so far")
    if row.status == JobStatus.COMPLETED:
        return f"{row.provider} job completed ({row.output_bytes} bytes of output)"
    kind = f" ({row.error_kind})" if row.error_kind else ""
    return f"{row.provider} job {row.status}{kind}: {row.error or 'no detail'}"


def ttl_ms(manager: JobManager, row: JobRow) -> int:
    """From creation until the retention purge may delete the row: retention counts from
    the end of the run, so while the task works the TTL grows with it (the spec lets it)."""
    retention = int(manager.settings.persistence.retention_days * MS_PER_DAY)
    if row.created_at is None:
        return retention
    end = row.finished_at or datetime.now(UTC)
    return max(0, int((end - row.created_at).total_seconds() * 1000)) + retention


def view(manager: JobManager, row: JobRow) -> TaskView:
    return TaskView(row, task_status(row), status_message(manager, row), ttl_ms(manager, row))


async def load_task(state: ServerState, task_id: str) -> tuple[JobManager, JobRow]:
    """The manager and the job behind a task id; -32602 for an unknown or purged one."""
    try:
        manager = await state.manager()
        return manager, await manager.get(task_id)
    except GatewayError as err:
        raise task_error(err) from None


def task_error(err: GatewayError) -> MCPError:
    """A job-layer failure as the JSON-RPC error the task specs name."""
    if err.kind == ErrorKind.JOB_NOT_FOUND:
        return MCPError(code=INVALID_PARAMS,
                        message=f"Failed to retrieve task: Task not found ({err.message})")
    return MCPError(code=INTERNAL_ERROR, message=err.message)


async def task_result(manager: JobManager, row: JobRow) -> dict[str, Any]:
    """The finished task's result: exactly the sync tool's answer, as wire JSON."""
    try:
        answer = await final_answer(manager, row)
    except GatewayError as err:
        raise task_error(err) from None
    return dump(answer)


def dump(result: CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def admit_as_task(ctx: ServerRequestContext[Any, Any],
                        call_next: CallNext) -> tuple[TaskAdmission, HandlerResult]:
    """Run the tool call with a TaskAdmission set: the tool validates and submits as a
    plain call does, then returns at once with the durable job in the admission. A call
    refused before a job existed (bad arguments, saturated) leaves it empty and its
    answer is the plain `isError` result."""
    admission = TaskAdmission()
    token = TASK_ADMISSION.set(admission)
    try:
        result = await call_next(ctx)
    finally:
        TASK_ADMISSION.reset(token)
    return admission, result


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

    def __init__(self, state: ServerState, task_tools: frozenset[str]) -> None:
        self.state = state
        self.task_tools = task_tools

    def methods(self) -> Sequence[MethodBinding]:
        from gateway.mcp import tasks_legacy

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
        task = view(manager, row)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            from gateway.mcp.tasks_legacy import legacy_fields

            return legacy_fields(task)
        data = {"resultType": "complete", **task.fields()}
        if task.status == "completed":
            data["result"] = await task_result(manager, row)
        return data

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
            from gateway.mcp.tasks_legacy import legacy_fields

            return legacy_fields(view(manager, outcome.job))
        return {"resultType": "complete"}


def _last_update(row: JobRow) -> datetime | None:
    stamps = [s for s in (row.created_at, row.started_at, row.updated_at, row.finished_at)
              if s is not None]
    return max(stamps) if stamps else None


def _stamp(value: datetime | None) -> str:
    """ISO 8601 in UTC with a Z, as the specs' examples."""
    moment = value or datetime.now(UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
