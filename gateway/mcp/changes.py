"""The `llm_job_changes` tool: what an isolated job changed, and applying or discarding it.

Its own module so the tool list's one new entry costs tools.py two lines; the work itself is
gateway.jobs.worktrees.changes, which the command line (`jobs diff|apply|discard`) shares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gateway.config import MAX_OUTPUT_BYTES_BOUND
from gateway.jobs.worktrees import changes, remote
from gateway.mcp.principal import owned
from gateway.mcp.results import job_fields, next_call, ok
from gateway.mcp.signatures import JOB_ID

if TYPE_CHECKING:
    from gateway.jobs.reads import JobReads
    from gateway.model import JobRow
    from gateway.store.base import JobStore

ToolBody = Callable[..., Awaitable[CallToolResult]]


class _State(Protocol):
    principal: str  # who calls (gateway/mcp/principal.py): another's job is not found

    async def reads(self) -> JobReads: ...

DEFAULT_DIFF_PAGE_BYTES = 100_000
MAX_DIFF_PAGE_BYTES = 400_000  # like llm_job_result: the page travels twice in one message


def change_tools(state: _State) -> list[tuple[str, ToolBody, ToolAnnotations]]:
    """[(name, body, annotations)] like job_tools.JobTools.tools()."""

    async def llm_job_changes(
        job_id: JOB_ID,
        action: Annotated[Literal["diff", "apply", "discard"], Field(
            description="apply: to working_dir")] = "diff",
        format: Annotated[Literal["stat", "patch"], Field(description="diff's")] = "stat",
        offset: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES_BOUND,
                                     description="next_offset")] = 0,
        max_bytes: Annotated[int, Field(ge=1, le=MAX_DIFF_PAGE_BYTES,
                                        description="page size")] = DEFAULT_DIFF_PAGE_BYTES,
    ) -> CallToolResult:
        """An isolated job's changes: diff, apply or discard them."""
        reads = await state.reads()
        row = owned(state.principal, await reads.get(job_id))
        host = reads.hostname
        fields = job_fields(row)
        if remote.is_remote_worktree(row):
            return await _remote(reads.store, row, host, action, format, offset, max_bytes)
        if action == "diff":
            page = await asyncio.to_thread(changes.diff, row, host, format, offset, max_bytes)
            return _diff_answer(row, fields, format, page)
        if action == "apply":
            done: dict[str, Any] = await asyncio.to_thread(changes.apply, row, host)
            text = (f"Applied job {row.id}'s changes to {done['checkout']} as uncommitted "
                    f"edits ({len(done['files'])} files); its worktree and branch are removed.")
        else:
            done = await asyncio.to_thread(changes.discard, row, host)
            text = f"Discarded job {row.id}'s worktree and branch {done['branch']}."
        return ok(text, {**fields, "action": action, **done, "message": text})

    return [("llm_job_changes", llm_job_changes,
             ToolAnnotations(destructive_hint=True, open_world_hint=False))]


def _diff_answer(row: JobRow, fields: dict[str, Any], format: str,
                 page: changes.DiffPage) -> CallToolResult:
    """A page of a diff, with the call for the next one."""
    action = "diff"
    data: dict[str, Any] = {**fields, "action": action, "format": format, "diff": page.text,
            "offset": page.offset, "next_offset": page.next_offset,
            "total_bytes": page.total_bytes, "tip": page.tip}
    text = page.text or "(no changes)"
    if page.next_offset is not None:
        data["next"] = next_call("llm_job_changes", "more diff follows", job_id=row.id,
                                 action=action, format=format, offset=page.next_offset)
        text += f"\n\n[More: call again with offset={page.next_offset}.]"
    return ok(text, data)


async def _remote(store: JobStore, row: JobRow, host: str, action: str, format: str,
                  offset: int, max_bytes: int) -> CallToolResult:
    """A worktree job that ran on another host: its stored patch (worktrees/remote.py)."""
    fields = job_fields(row)
    if action == "diff":
        page = await remote.remote_diff(store, row, host, format, offset, max_bytes)
        return _diff_answer(row, fields, format, page)
    if action == "apply":
        done = await remote.remote_apply(store, row, host)
        text = (f"Applied job {row.id}'s changes to {done['checkout']} as uncommitted edits "
                f"({len(done['files'])} files); its worktree on {done['worktree_host']} is "
                f"removed by the worker there.")
    else:
        done = await remote.remote_discard(store, row, host)
        text = (f"Discarded job {row.id}'s changes; its worktree on {done['worktree_host']} "
                f"is removed by the worker there.")
    return ok(text, {**fields, "action": action, **done, "message": text})
