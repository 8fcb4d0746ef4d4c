"""Keeping one attempt of a group: apply it, keep its branch, or discard every attempt.

Apply and discard are `llm_job_changes`' own (gateway/jobs/worktrees/changes.py): the same
refusals (uncommitted work on a file the attempt changed, a patch that does not apply: then
nothing changed, the group included) and the same removal of worktree and branch. The group
then moves by compare-and-set (running | done -> picked | discarded): of two picks one wins.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.jobs.attempts.coordinator import discard_all_but
from gateway.jobs.manager import JobManager
from gateway.jobs.worktrees import changes
from gateway.jobs.worktrees.finish import worktree_of
from gateway.model import ErrorKind, GatewayError, JobRow
from gateway.store.attempts import PICKABLE, AttemptGroupRow, GroupEnd, GroupStatus
from gateway.store.base import StoreUnavailable

ACTIONS = ("apply", "keep", "discard")


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


async def _jobs(manager: JobManager, group: AttemptGroupRow) -> list[JobRow]:
    rows = []
    for attempt in await manager.store.list_attempts(group.group_id):
        row = await manager.store.get_job(attempt.job_id, with_output=False)
        if row is not None:
            rows.append(row)
    return rows


async def _cancel_active(manager: JobManager, jobs: list[JobRow], keep: str | None) -> None:
    for job in jobs:
        if job.id != keep and job.status.is_active:
            with contextlib.suppress(GatewayError, StoreUnavailable):
                await manager.cancel(job.id)


async def pick(manager: JobManager, group: AttemptGroupRow, job_id: str | None,
               action: str) -> dict[str, Any]:
    """Do `action` on the group; what was done. Raises GatewayError(invalid_input) when the
    action cannot be done (nothing changed then)."""
    if action not in ACTIONS:
        raise _invalid(f"action must be one of {', '.join(ACTIONS)}; got {action!r}.")
    if group.status not in PICKABLE:
        raise _invalid(f"Group {group.group_id} is already {group.status}: nothing to pick.")
    jobs = await _jobs(manager, group)
    if action == "discard":
        if job_id is not None:
            raise _invalid("discard takes no job_id: it discards every attempt.")
        await _cancel_active(manager, jobs, None)
        if not await manager.store.end_attempt_group(GroupEnd(
                group.group_id, PICKABLE, GroupStatus.DISCARDED)):
            raise _invalid(f"Group {group.group_id} was picked or discarded meanwhile.")
        jobs = await _jobs(manager, group)
        discarded = await discard_all_but(manager.hostname, jobs, None)
        return {"action": action, "status": str(GroupStatus.DISCARDED),
                "discarded": discarded}
    chosen = next((job for job in jobs if job.id == job_id), None)
    if chosen is None:
        raise _invalid(f"Job {job_id!r} is not an attempt of group {group.group_id}; pass "
                       f"one of {[job.id for job in jobs]}.")
    if chosen.status.is_active:
        raise _invalid(f"Attempt {chosen.id} is still {chosen.status}; pick it once it has "
                       f"ended (llm_attempts_status with wait_s).")
    done: dict[str, Any] = {}
    if action == "apply":  # refused as a whole, group untouched, when it cannot apply
        done = await asyncio.to_thread(changes.apply, chosen, manager.hostname)
    if not await manager.store.end_attempt_group(GroupEnd(
            group.group_id, PICKABLE, GroupStatus.PICKED, winner_job_id=chosen.id,
            winner_reason=f"picked by the caller ({action})")):
        raise _invalid(f"Group {group.group_id} was picked or discarded meanwhile.")
    await _cancel_active(manager, jobs, chosen.id)
    jobs = await _jobs(manager, group)
    discarded = await discard_all_but(manager.hostname, jobs, chosen.id)
    kept = None
    if action == "keep":
        kept = (worktree_of(chosen.request_json, chosen.result_json) or {}).get("branch")
    return {"action": action, "status": str(GroupStatus.PICKED), "job_id": chosen.id,
            "applied": done or None, "branch_kept": kept, "discarded": discarded}
