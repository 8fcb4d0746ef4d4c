"""`llm_attempts`, `llm_attempts_status`, `llm_attempts_pick`: best-of-N (issue 39).

The tools are thin: admission is gateway/jobs/attempts/admit.py, the comparison
comparison.py, the pick pick.py (whose apply and discard are llm_job_changes' own code).
Descriptions are lean on purpose: every byte is in each calling model's context
(tests/mcp/test_listing.py); docs/tools.md says the rest. Field names are the contract.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gateway.config import MAX_TIMEOUT_S, MAX_USD
from gateway.mcp.progress import Progress
from gateway.mcp.results import next_call, ok
from gateway.model import ErrorKind, GatewayError
from gateway.store.attempts import (
    DEFAULT_CHECK_TIMEOUT_S,
    MAX_CHECK_TIMEOUT_S,
    AttemptGroupRow,
)

if TYPE_CHECKING:
    from gateway.jobs.attempts.admit import AttemptTarget
    from gateway.jobs.manager import JobManager

ToolBody = Callable[..., Awaitable[CallToolResult]]
MAX_STATUS_WAIT_S = 50.0  # under the common 60 s client tool timeout
STATUS_POLL_S = 0.5  # how often a waiting status re-reads the group
APPLY = "apply"  # the pick `next` proposes for a winner


class _State(Protocol):
    principal: str

    async def manager(self) -> JobManager: ...


def _targets(given: list[dict[str, Any]]) -> list[AttemptTarget]:
    """The targets as admission takes them; refused with what a target looks like."""
    from gateway.jobs.attempts.admit import AttemptTarget  # deferred: start-up

    shaped = []
    for target in given:
        provider, model, count = target.get("provider"), target.get("model"), target.get(
            "count", 1)
        if (set(target) - {"provider", "model", "count"} or not isinstance(provider, str)
                or not (model is None or isinstance(model, str))
                or not isinstance(count, int) or isinstance(count, bool)):
            raise GatewayError(ErrorKind.INVALID_INPUT,
                               "each target is {\"provider\": name, \"model\": optional "
                               f"name, \"count\": optional integer >= 1}}; got {target!r}.")
        shaped.append(AttemptTarget(provider, model, count))
    return shaped


def _judge(given: dict[str, Any] | None) -> dict[str, Any] | None:
    if given is None:
        return None
    if (set(given) - {"provider", "model"} or not isinstance(given.get("provider"), str)
            or not isinstance(given.get("model", ""), str)):
        raise GatewayError(ErrorKind.INVALID_INPUT,
                           f"judge is {{\"provider\": name, \"model\": optional name}}; "
                           f"got {given!r}.")
    return dict(given)


def _not_found(group_id: str) -> GatewayError:
    return GatewayError(ErrorKind.NOT_FOUND, f"No attempt group {group_id!r}; "
                                             f"llm_attempts returns a group_id.")


async def owned_group(manager: JobManager, principal: str, group_id: str) -> AttemptGroupRow:
    """The group if it exists and `principal` made it (another's reads as not found)."""
    group = await manager.store.get_attempt_group(group_id)
    if group is None or (group.principal is not None and group.principal != principal):
        raise _not_found(group_id)
    return group


def attempt_tools(state: _State) -> list[tuple[str, ToolBody, ToolAnnotations]]:
    """[(name, body, annotations)] like job_tools.JobTools.tools()."""

    async def llm_attempts(
        prompt: Annotated[str, Field(description="The task.")],
        targets: Annotated[list[dict[str, Any]], Field(description="[{provider,model,count}]")],
        working_dir: Annotated[str, Field(description="A git dir.")],
        base_ref: Annotated[str, Field(description="Start.")] = "HEAD",
        check: Annotated[list[str] | None, Field(description="argv")] = None,
        check_timeout_s: Annotated[float, Field(description="s", gt=0, le=MAX_CHECK_TIMEOUT_S)
                                   ] = DEFAULT_CHECK_TIMEOUT_S,
        until: Annotated[Literal["all", "first_passing"], Field(description="End.")] = "all",
        judge: Annotated[dict[str, Any] | None, Field(description="{provider,model}")] = None,
        timeout_s: Annotated[float | None, Field(description="Each, s", gt=0,
                                                 le=MAX_TIMEOUT_S)] = None,
        max_cost_usd: Annotated[float | None, Field(description="Each, USD", ge=0,
                                                    le=MAX_USD)] = None,
    ) -> CallToolResult:
        """One task as N attempts in worktrees, checked and ranked."""
        # The job machinery loads after the handshake, never for tools/list.
        from gateway.jobs.attempts.admit import GroupRequest, submit_group  # deferred: start-up

        manager = await state.manager()
        submission = await submit_group(manager, GroupRequest(
            prompt=prompt, working_dir=working_dir, base_ref=base_ref, check=check,
            targets=_targets(targets),
            check_timeout_s=check_timeout_s, until=until,
            judge=_judge(judge),
            timeout_s=timeout_s, max_cost_usd=max_cost_usd, principal=state.principal))
        group = submission.group
        jobs = {job.id: job for job in [await manager.store.get_job(i, with_output=False)
                                        for i in submission.job_ids] if job is not None}
        attempts = [{"job_id": i, "provider": jobs[i].provider if i in jobs else None,
                     "model": jobs[i].model if i in jobs else None}
                    for i in submission.job_ids]
        text = (f"{'Joined' if submission.joined else 'Started'} attempt group "
                f"{group.group_id}: {len(attempts)} attempts from {group.base_sha[:12]}. "
                f"Call llm_attempts_status(group_id=\"{group.group_id}\", wait_s=30).")
        return ok(text, {
            "group_id": group.group_id, "status": str(group.status), "attempts": attempts,
            "deduplicated": submission.joined, "message": text,
            "next": next_call("llm_attempts_status", "wait for the comparison",
                              group_id=group.group_id, wait_s=30)})

    async def llm_attempts_status(
        group_id: Annotated[str, Field(description="Its id")],
        ctx: Context,
        wait_s: Annotated[float, Field(ge=0, le=MAX_STATUS_WAIT_S, description="s")] = 0,
    ) -> CallToolResult:
        """A group's ranked attempts; waits up to wait_s."""
        from gateway.jobs.attempts.comparison import (  # deferred: start-up
            comparison,
            comparison_table,
        )

        manager = await state.manager()
        group = await owned_group(manager, state.principal, group_id)
        progress = Progress(ctx)
        deadline = time.monotonic() + wait_s
        while group.status == "running" and time.monotonic() < deadline:
            attempts = await manager.store.list_attempts(group_id)
            settled = sum(1 for a in attempts if a.check_state in ("done", "skipped"))
            await progress.report(settled, f"group {group_id}: {settled} of {len(attempts)} "
                                           f"attempts settled after {progress.elapsed_s:.0f} s")
            await asyncio.sleep(min(STATUS_POLL_S, max(0.0, deadline - time.monotonic())))
            group = await owned_group(manager, state.principal, group_id)
        data = await comparison(manager.store, manager.hostname, group)
        if not data["done"]:
            data["next"] = next_call("llm_attempts_status", "the group still runs",
                                     group_id=group_id, wait_s=30)
        elif data["status"] == "done" and data["winner"]:
            data["next"] = next_call("llm_attempts_pick", "apply the winner", group_id=group_id,
                                     job_id=data["winner"]["job_id"], action=APPLY)
        text = comparison_table(data)
        data["message"] = text
        return ok(text, data)

    async def llm_attempts_pick(
        group_id: Annotated[str, Field(description="Its id")],
        job_id: Annotated[str | None, Field(description="The attempt")] = None,
        action: Annotated[Literal["apply", "keep", "discard"], Field(
            description="keep: branch")] = "apply",
    ) -> CallToolResult:
        """Keep one attempt (apply it) and discard the rest, or all."""
        from gateway.jobs.attempts.pick import pick  # deferred: start-up

        manager = await state.manager()
        group = await owned_group(manager, state.principal, group_id)
        if action != "discard" and job_id is None:
            raise GatewayError(ErrorKind.INVALID_INPUT,
                               f"{action} needs job_id: the attempt to keep (the winner is in "
                               f"llm_attempts_status).")
        done = await pick(manager, group, job_id, action)
        text = (f"Group {group_id} discarded." if action == "discard" else
                f"Group {group_id}: attempt {job_id} "
                f"{'applied to the checkout' if action == 'apply' else 'kept'}; "
                f"{len(done['discarded'])} other attempts discarded.")
        return ok(text, {"group_id": group_id, **done, "message": text})

    hints = ToolAnnotations(open_world_hint=False)
    return [
        ("llm_attempts", llm_attempts, hints),
        ("llm_attempts_status", llm_attempts_status,
         ToolAnnotations(read_only_hint=True, open_world_hint=False)),
        ("llm_attempts_pick", llm_attempts_pick,
         ToolAnnotations(destructive_hint=True, open_world_hint=False)),
    ]
