"""The job seen as an MCP task: the words both task wire versions share (tasks.py serves
the 2026-07-28 extension, tasks_legacy.py the 2025-11-25 experimental tasks).

A task *is* a job: the task id is the job id, its state is the job row, and its result is
exactly the `CallToolResult` the sync `<provider>_request` returns for that job
(`tools.final_answer`). Nothing about a task lives in this process, so any gateway sharing
the store answers for any task.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, RequestParams
from pydantic import ConfigDict, Field

from gateway.mcp.admission import TASK_ADMISSION, TaskAdmission
from gateway.mcp.principal import owned
from gateway.mcp.server_state import ServerState
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus

if TYPE_CHECKING:  # the job machinery loads after the handshake (startup stays light)
    from gateway.jobs.manager import JobManager
    from gateway.jobs.reads import JobReads

LEGACY_TASKS_VERSION = "2025-11-25"  # the one handshake version that has (experimental) tasks
# Another instance's view of a running job is at most PROGRESS_FLUSH_S (2 s) stale and a
# remote wait re-reads the row once a second: polling faster than that learns nothing.
POLL_INTERVAL_MS = 1000
MS_PER_DAY = 86_400_000


class TaskIdParams(RequestParams):
    """`tasks/get`, `tasks/cancel`, `tasks/result`: the task id (other keys ignored)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    task_id: str = Field(alias="taskId")


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


class ProviderRequestTools(Container[str]):
    """The tools that may become tasks: each provider's sync `<provider>_request`.

    A rule on the name, not a list: the listed provider tools follow what is installed
    (listing.py), and a call to a provider that is not listed gets its plain `not_found`
    answer through the same admission, never a task.
    """

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.endswith("_request")


TASK_TOOLS = ProviderRequestTools()


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
        return manager, owned(state.principal, await manager.reads.get(task_id))
    except GatewayError as err:
        raise task_error(err) from None


async def detailed_task(manager: JobManager, row: JobRow) -> dict[str, Any]:
    """The 2026-07-28 `DetailedTask`: what `tasks/get` answers (less its `resultType`) and
    what `notifications/tasks` carries, the finished task's result inlined."""
    task = view(manager, row)
    data = task.fields()
    if task.status == "completed":
        data["result"] = await task_result(manager.reads, row)
    return data


def task_error(err: GatewayError) -> MCPError:
    """A job-layer failure as the JSON-RPC error the task specs name."""
    if err.kind in (ErrorKind.JOB_NOT_FOUND, ErrorKind.LEGACY_JOB):
        # A legacy job is no task of a token's either; the message says why (principal.py).
        return MCPError(code=INVALID_PARAMS,
                        message=f"Failed to retrieve task: Task not found ({err.message})")
    return MCPError(code=INTERNAL_ERROR, message=err.message)


async def task_result(reads: JobReads, row: JobRow) -> dict[str, Any]:
    """The finished task's result: exactly the sync tool's answer, as wire JSON."""
    # The tools load at the first request that needs them, not with the server.
    from gateway.mcp.tools import final_answer  # deferred: start-up

    try:
        answer = await final_answer(reads, row)
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


def _last_update(row: JobRow) -> datetime | None:
    stamps = [s for s in (row.created_at, row.started_at, row.updated_at, row.finished_at)
              if s is not None]
    return max(stamps) if stamps else None


def _stamp(value: datetime | None) -> str:
    """ISO 8601 in UTC with a Z, as the specs' examples."""
    moment = value or datetime.now(UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
