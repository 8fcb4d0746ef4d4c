"""The comparison of an attempt group: the evidence the gateway gathered, row by row, ranked.

Everything here is read by the gateway itself, never taken from an agent's claims: the job
row (status, error, duration), its worktree report (diffstat and files, committed by the
settlement), whether its changes apply cleanly to the checkout's *current* HEAD (asked of git
now, as `apply` would), the check's exit code and output tail (the store's attempt row), the
usage the CLI reported, and the first 500 characters of the agent's answer. `llm_attempts_status`
and `attempts show` answer with `comparison()`; the ranking rule is ranking.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.jobs.attempts.ranking import Evidence, Ranking, rank
from gateway.jobs.worktrees import changes
from gateway.jobs.worktrees.finish import worktree_of
from gateway.jobs.worktrees.git import GitError, git
from gateway.model import JobRow, JobStatus
from gateway.store.attempts import AttemptGroupRow, AttemptRow, CheckState, GroupStatus
from gateway.store.base import JobStore

FINAL_MESSAGE_CHARS = 500
MAX_FILES_SHOWN = 50


@dataclass(slots=True)
class AttemptView:
    """One attempt as the comparison shows it, with the ranking's evidence."""

    row: dict[str, Any]
    evidence: Evidence


def _parsed(result_json: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(result_json) if result_json else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _duration_s(job: JobRow) -> float | None:
    if job.started_at is None or job.finished_at is None:
        return None
    return round((job.finished_at - job.started_at).total_seconds(), 3)


def _files(worktree: dict[str, Any] | None, job: JobRow) -> list[str]:
    """The paths the attempt changed, from its branch (git, on this host)."""
    if not worktree or not worktree.get("changed") or not worktree.get("head_sha"):
        return []
    plan_dir = job.working_dir  # the caller's checkout: the branch is reachable from it
    if not plan_dir:
        return []
    try:
        out = git(["diff", "--name-only", "--no-renames", "-z", str(worktree["base_sha"]),
                   str(worktree["head_sha"]), "--"], plan_dir)
    except (GitError, OSError):
        return []
    names = [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]
    return names[:MAX_FILES_SHOWN]


def check_view(group: AttemptGroupRow, attempt: AttemptRow) -> dict[str, Any] | None:
    """The row's `check`: its result, or None (then `check_skipped` says why)."""
    if attempt.check_state is not CheckState.DONE:
        return None
    exit_code = attempt.check_exit_code
    return {"argv": group.check_argv, "exit_code": exit_code, "passed": exit_code == 0,
            "duration_s": attempt.check_duration_s, "output_tail": attempt.check_output_tail,
            "reason": attempt.check_reason}


def _check_skipped(group: AttemptGroupRow, attempt: AttemptRow) -> str | None:
    if attempt.check_state is CheckState.DONE:
        return None
    if attempt.check_state is CheckState.SKIPPED:
        return attempt.check_reason
    if group.check_argv is None:
        return "no_check"
    return "running" if attempt.check_state is CheckState.RUNNING else "pending"


async def _final_message(store: JobStore, job: JobRow) -> str | None:
    if not job.status.is_terminal:
        return None
    page = await store.read_output(job.id, 0, FINAL_MESSAGE_CHARS * 4, answer=True)
    if page is None:
        return None
    return page[0].decode("utf-8", errors="ignore")[:FINAL_MESSAGE_CHARS]


async def attempt_view(store: JobStore, hostname: str, group: AttemptGroupRow,
                       attempt: AttemptRow, job: JobRow) -> AttemptView:
    parsed = _parsed(job.result_json)
    worktree = worktree_of(job.request_json, job.result_json)
    changed = bool(worktree and worktree.get("changed"))
    applies = None
    files: list[str] = []
    if changed and job.status.is_terminal:
        applies = await asyncio.to_thread(changes.applies_cleanly, job, hostname)
        files = await asyncio.to_thread(_files, worktree, job)
    insertions = int((worktree or {}).get("insertions") or 0)
    deletions = int((worktree or {}).get("deletions") or 0)
    usage = parsed.get("usage") if isinstance(parsed.get("usage"), dict) else None
    cost = usage.get("cost_usd") if usage else None
    check = check_view(group, attempt)
    duration = _duration_s(job)
    evidence = Evidence(
        job_id=job.id, ordinal=attempt.ordinal,
        completed=job.status is JobStatus.COMPLETED, changed=changed,
        check_exit_code=attempt.check_exit_code, check_ran=check is not None,
        applies_cleanly=applies, changed_lines=insertions + deletions,
        cost_usd=float(cost) if isinstance(cost, (int, float)) else None, duration_s=duration)
    row: dict[str, Any] = {
        "job_id": job.id, "provider": job.provider, "model": job.model,
        "status": str(job.status), "rank": None, "duration_s": duration, "usage": usage,
        "changes": {"files_changed": int((worktree or {}).get("files_changed") or 0),
                    "insertions": insertions, "deletions": deletions, "files": files,
                    "applies_cleanly": applies,
                    "branch": (worktree or {}).get("branch") if changed else None},
        "check": check, "check_skipped": _check_skipped(group, attempt),
        "final_message": await _final_message(store, job), "error_kind": job.error_kind,
    }
    return AttemptView(row, evidence)


def ranked(views: Sequence[AttemptView], has_check: bool) -> tuple[list[dict[str, Any]],
                                                                  Ranking]:
    """The rows best first, each with its rank (its class), and the ranking."""
    ranking = rank([view.evidence for view in views], has_check=has_check)
    by_id = {view.evidence.job_id: view.row for view in views}
    rows = []
    for one in ranking.rows:
        row = by_id[one.evidence.job_id]
        row["rank"] = one.rank
        rows.append(row)
    return rows, ranking


def usage_total(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The group's cost and tokens: the sum of what its jobs reported (a cost is known only
    when every job that has one reported it)."""
    cost, tokens_in, tokens_out, unknown = 0.0, 0, 0, 0
    for row in rows:
        usage = row.get("usage") or {}
        value = usage.get("cost_usd")
        if isinstance(value, (int, float)):
            cost += float(value)
        else:
            unknown += 1
        tokens_in += int(usage.get("input_tokens") or 0)
        tokens_out += int(usage.get("output_tokens") or 0)
    return {"cost_usd": round(cost, 6), "jobs_without_cost": unknown,
            "input_tokens": tokens_in, "output_tokens": tokens_out}


async def comparison(store: JobStore, hostname: str, group: AttemptGroupRow,
                     ) -> dict[str, Any]:
    """What `llm_attempts_status` answers for `group` as the store has it now."""
    attempts = await store.list_attempts(group.group_id)
    views = []
    for attempt in attempts:
        job = await store.get_job(attempt.job_id, with_output=False)
        if job is not None:
            views.append(await attempt_view(store, hostname, group, attempt, job))
    rows, ranking = ranked(views, group.check_argv is not None)
    done = group.status is not GroupStatus.RUNNING
    winner: dict[str, Any] | None = None
    if group.winner_job_id is not None:
        winner = {"job_id": group.winner_job_id, "reason": group.winner_reason}
    elif done and ranking.winner is not None:
        winner = {"job_id": ranking.winner, "reason": ranking.reason}
    judge, judge_usage = await _judge_view(store, group)
    pick = (group.judge_result or {}).get("pick")
    if pick is not None:  # the judged attempt goes first (it qualifies: the best class)
        rows.sort(key=lambda row: row["job_id"] != pick)
    usage = usage_total([*rows, {"usage": judge_usage}] if judge_usage is not None else rows)
    return {"group_id": group.group_id, "status": str(group.status), "done": done,
            "base_sha": group.base_sha, "until": group.until, "attempts": rows,
            "winner": winner, "judge": judge, "usage": usage}


async def _judge_view(store: JobStore, group: AttemptGroupRow,
                      ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The status's `judge` ({job_id, provider, model, status, pick, reason, error}) and the
    judge job's usage (it counts in the group's)."""
    if group.judge is None:
        return None, None
    view: dict[str, Any] = {"provider": group.judge.get("provider"),
                            "model": group.judge.get("model"), "job_id": group.judge_job_id,
                            "status": "pending", "pick": None, "reason": None}
    usage = None
    if group.judge_job_id is not None:
        job = await store.get_job(group.judge_job_id, with_output=False)
        if job is not None:
            view["status"] = str(job.status)
            found = _parsed(job.result_json).get("usage")
            usage = found if isinstance(found, dict) else None
    view.update(group.judge_result or {})
    return view, usage


def comparison_table(data: dict[str, Any]) -> str:
    """The comparison as a table for a person (the tool's text, `attempts show`)."""
    lines = [f"group {data['group_id']}: {data['status']} (base {data['base_sha'][:12]})"]
    for row in data["attempts"]:
        check = row["check"]
        shown = ("check " + ("passed" if check["passed"] else f"failed ({check['exit_code']})")
                 if check else f"no check ({row['check_skipped']})")
        changes = row["changes"]
        lines.append(f"  {row['rank']}  {row['job_id']}  {row['provider']:<8} "
                     f"{row['status']:<9} +{changes['insertions']}/-{changes['deletions']} "
                     f"in {changes['files_changed']} files  {shown}")
    judge = data.get("judge")
    if judge:
        said = (f"picked {judge['pick']}" if judge.get("pick")
                else judge.get("error") or judge.get("status"))
        lines.append(f"judge: {judge.get('provider')} {judge.get('job_id') or ''}: {said}")
    winner = data.get("winner")
    lines.append(f"winner: {winner['job_id']} ({winner['reason']})" if winner
                 else "winner: none yet" if not data["done"] else "winner: none")
    return "\n".join(lines)
