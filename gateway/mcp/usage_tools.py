"""`llm_usage`: usage and cost across every job in the store (issue 28; jobs/usage_report.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Protocol

from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gateway.jobs.usage_report import usage_report, usage_table
from gateway.mcp.results import ok

if TYPE_CHECKING:
    from gateway.jobs.manager import JobManager

ToolBody = Callable[..., Awaitable[CallToolResult]]


class ManagerSource(Protocol):
    """What the tool needs of the server's state (server_state.ServerState): the manager, once
    the store is open."""

    async def manager(self) -> JobManager: ...


def usage_tools(state: ManagerSource) -> list[tuple[str, ToolBody, ToolAnnotations]]:
    async def llm_usage(
        group_by: Annotated[str | None, Field(
            description="provider, model or day")] = None,
        since: Annotated[str | None, Field(description="First UTC day")] = None,
        until: Annotated[str | None, Field(description="Last UTC day")] = None,
    ) -> CallToolResult:
        """Usage totals of all jobs."""
        # Lean on purpose: every byte of the listing is in each model's context
        # (tests/mcp/test_listing.py); docs/tools.md and the invalid_input message say more.
        manager = await state.manager()
        report = await usage_report(manager.store, group_by or "provider", since, until)
        return ok(usage_table(report), report)

    return [("llm_usage", llm_usage, ToolAnnotations(read_only_hint=True,
                                                      open_world_hint=False))]
