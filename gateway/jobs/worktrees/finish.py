"""The end of an isolated run: what the CLI changed is committed to the job's branch.

One call (`settle_worktree`) in the one finalize path, for a run this gateway started and for
one it adopted alike. A run that changed nothing has its worktree and branch removed at once
(no pile of empty worktrees: claude-code #63087, 80 GB); one with changes keeps both, the
directory for `[worktrees] retention_h` (gc.py), the branch until applied or discarded. The
job's result then carries `worktree`: `{path, branch, base_sha, changed, files_changed,
insertions, deletions}`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.jobs.requests import WORKTREE_KEY
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.create import (
    WorktreePlan,
    git_quiet,
    plan_of,
    remove_worktree,
    repository_lock,
)
from gateway.jobs.worktrees.git import GitError, git, git_text

log = structlog.get_logger(__name__)

COMMITTER = "agent-cli-gateway"
COMMITTER_EMAIL = "agent-cli-gateway@localhost"
_SHORTSTAT = re.compile(r"(\d+) files? changed(?:, (\d+) insertions?\(\+\))?"
                        r"(?:, (\d+) deletions?\(-\))?")


def author_env(job_id: str) -> dict[str, str]:
    """Who commits a job's work: the gateway, naming the job (no user config needed)."""
    name = f"{COMMITTER} job {job_id}"
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": COMMITTER_EMAIL,
            "GIT_COMMITTER_NAME": COMMITTER, "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL}


def shortstat(plan: WorktreePlan, head: str) -> tuple[int, int, int]:
    text = git_text(["diff", "--shortstat", plan.base_sha, head, "--"], plan.toplevel)
    match = _SHORTSTAT.search(text)
    if match is None:
        return 0, 0, 0
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[return-value]


def commit_worktree(plan: WorktreePlan, job_id: str, ended: str) -> str:
    """Commit everything the run left in the worktree (hooks off, no signing prompt);
    return the branch's tip."""
    path = plan.path
    git_quiet(["worktree", "unlock", path], plan.toplevel)
    git(["add", "--all", "--", "."], path)
    try:
        git(["diff", "--cached", "--quiet"], path)
        staged = False
    except GitError as err:
        if err.stderr:
            raise
        staged = True
    if staged:
        git(["-c", "commit.gpgsign=false", "commit", "--no-verify", "--quiet", "-m",
             f"agent-cli-gateway: job {job_id} ({ended})\n\nWhat the job's CLI changed in its "
             f"worktree, committed by the gateway."], path, env=author_env(job_id))
    return git_text(["rev-parse", "--verify", f"refs/heads/{plan.branch}"], plan.toplevel)


def finish_worktree(plan: WorktreePlan, job_id: str, ended: str) -> dict[str, Any]:
    """Commit, measure, and keep or remove the job's worktree. Never raises: a problem is
    reported in the answer (`error`) and the worktree is kept for a person."""
    report: dict[str, Any] = {"path": plan.path, "branch": plan.branch,
                              "base_sha": plan.base_sha, "changed": None, "files_changed": 0,
                              "insertions": 0, "deletions": 0}
    record = records.read_record(Path(plan.path))
    if record is not None and record.job_id != job_id:
        report["error"] = "the worktree's record names another job; left untouched"
        return report
    try:
        if not Path(plan.path).is_dir():
            raise GitError(f"the worktree {plan.path!r} is gone")
        head = commit_worktree(plan, job_id, ended)
        files, plus, minus = shortstat(plan, head)
    except (GitError, OSError) as exc:
        report["error"] = f"could not commit the job's changes: {exc}"
        log.warning("worktree not committed", action="worktree_commit", job_id=job_id,
                    error=str(exc))
        return report
    changed = head != plan.base_sha
    report.update(head_sha=head, changed=changed, files_changed=files, insertions=plus,
                  deletions=minus, kept=changed)
    if not changed:
        with repository_lock(plan.common_dir):
            remove_worktree(plan.toplevel, plan.path, plan.branch)
        if record is not None:
            record.delete()
        report["removed"] = True
    elif record is not None:
        record.state, record.ended_at, record.head_sha = records.KEPT, time.time(), head
        record.files_changed, record.insertions, record.deletions = files, plus, minus
        record.save()
    log.info("worktree settled", action="worktree_settle", job_id=job_id, changed=changed,
             files_changed=files)
    return report


async def settle_worktree(plan: WorktreePlan | None, job_id: str,
                          ended: str) -> dict[str, Any] | None:
    """The end of a run for an isolated job: commit, measure, keep or remove; the report is
    the job's `worktree` (None: the job is not isolated). Off the event loop; never raises,
    so the terminal write happens whatever git did."""
    if plan is None:
        return None
    try:
        return await asyncio.to_thread(finish_worktree, plan, job_id, ended)
    except Exception as exc:
        log.exception("worktree settle failed", action="worktree_settle", job_id=job_id)
        return {"path": plan.path, "branch": plan.branch, "base_sha": plan.base_sha,
                "changed": None, "files_changed": 0, "insertions": 0, "deletions": 0,
                "error": str(exc)}


def worktree_of(request_json: str | None, result_json: str | None) -> dict[str, Any] | None:
    """What a status or result shows as `worktree`: the outcome once the run ended, else
    the plan (changed: null)."""
    if result_json:
        try:
            parsed = json.loads(result_json)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get(WORKTREE_KEY), dict):
            shown: dict[str, Any] = parsed[WORKTREE_KEY]
            return shown
    plan = plan_of(request_json)
    if plan is None:
        return None
    return {"path": plan.path, "branch": plan.branch, "base_sha": plan.base_sha,
            "changed": None, "files_changed": None, "insertions": None, "deletions": None}
