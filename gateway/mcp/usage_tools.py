"""`llm_usage`: usage and cost across every job in the store (issue 28; jobs/usage_report.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gateway.jobs.usage_report import usage_report, usage_table
from gateway.mcp.results import ok

if TYPE_CHECKING:
    from gateway.jobs.manager import JobManager

ToolBody = Callable[..., Awaitable[CallToolResult]]


class ManagerSource(Protocol):
    """What the tool needs of the server's state (tools.ServerState): the manager, once
    the store is open."""

    async def manager(self) -> JobManager: ...

DAY = "UTC day: YYYY-MM-DD, 'today' or 'Nd' (last N days)."


def usage_tools(state: ManagerSource) -> list[tuple[str, ToolBody, ToolAnnotations]]:
    async def llm_usage(
        group_by: Annotated[Literal["provider", "model", "day"],
                            Field(description="How to group the totals.")] = "provider",
        since: Annotated[str | None, Field(description=f"First {DAY}")] = None,
        until: Annotated[str | None, Field(description=f"Last {DAY}")] = None,
    ) -> CallToolResult:
        """Tokens and cost of all jobs in the store (every gateway sharing it), per
        provider, model or day; cost_source says reported, estimated, absent or mixed."""
        manager = await state.manager()
        report = await usage_report(manager.store, group_by, since, until)
        return ok(usage_table(report), report)

    return [("llm_usage", llm_usage, ToolAnnotations(read_only_hint=True,
                                                      open_world_hint=False))]
