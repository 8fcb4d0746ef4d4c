"""The end of an isolated run: what the CLI changed is committed to the job's branch.

One call (`settle_worktree`), a step of the drive between the run's end and its terminal
write (gateway/jobs/drive.py), for a run this gateway started and for one it adopted alike.
A run that changed nothing has its worktree and branch removed at once (no pile of empty
worktrees: claude-code #63087, 80 GB); one with changes keeps both, the directory for
`[worktrees] retention_h` (gc.py), the branch until applied or discarded. The job's result
then carries `worktree`: `{path, branch, base_sha, changed, files_changed, insertions,
deletions, state}`; `state` is what became of it since (#27): the host's record of it is
read when the job is shown (`worktree_of`), so an applied, discarded or expired worktree is
reported as such, its `path` null once the directory is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.jobs.requests import WORKTREE_KEY
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.create import (
    WorktreeError,
    WorktreePlan,
    git_quiet,
    plan_of,
    remove_worktree,
    repository_lock,
)
from gateway.jobs.worktrees.git import GitError, git, git_text, repository
from gateway.jobs.worktrees.verify import place_of, tampering

log = structlog.get_logger(__name__)

COMMITTER = "agent-cli-gateway"
COMMITTER_EMAIL = "agent-cli-gateway@localhost"
# `worktree.state` as a job's status and result show it (#27). The record's own names stay
# (`branch` is the on-disk state of an expired one); callers read these.
PLANNED_SHOWN = "planned"  # admitted, no worktree made yet
KEPT_SHOWN = "kept"  # the run ended; directory and branch are there (diff, apply, discard)
REMOVED_SHOWN = "removed"  # the run changed nothing: worktree and branch removed at once
TAMPERED_SHOWN = "tampered"  # not as the gateway made it: not committed, nothing removed
_SHOWN_STATE = {records.CREATING: "creating", records.RUNNING: "running",
                records.KEPT: KEPT_SHOWN, records.BRANCH_ONLY: "expired",
                records.APPLIED: "applied", records.DISCARDED: "discarded",
                records.TAMPERED: TAMPERED_SHOWN}
GONE_SHOWN = frozenset({REMOVED_SHOWN, "expired", "applied", "discarded"})  # no directory
_SHORTSTAT = re.compile(r"(\d+) files? changed(?:, (\d+) insertions?\(\+\))?"
                        r"(?:, (\d+) deletions?\(-\))?")


def author_env(job_id: str) -> dict[str, str]:
    """Who commits a job's work: the gateway, naming the job (no user config needed)."""
    name = f"{COMMITTER} job {job_id}"
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": COMMITTER_EMAIL,
            "GIT_COMMITTER_NAME": COMMITTER, "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL}


def shortstat(plan: WorktreePlan, head: str) -> tuple[int, int, int]:
    text = git_text(["diff", "--shortstat", plan.base_sha, head, "--"],
                    repository(plan.common_dir))
    match = _SHORTSTAT.search(text)
    if match is None:
        return 0, 0, 0
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[return-value]


def commit_worktree(plan: WorktreePlan, job_id: str, ended: str, lfs: bool = False) -> str:
    """Commit everything the run left in the worktree (hooks and filters off, no signing
    prompt), naming its git dir and work tree: never found from the directory; return the
    branch's tip. The caller verified the worktree (verify.tampering) a moment ago."""
    place = place_of(plan)
    git_quiet(["worktree", "unlock", plan.path], repository(plan.common_dir))
    git(["add", "--all"], place, lfs=lfs)
    try:
        git(["diff", "--cached", "--quiet"], place)
        staged = False
    except GitError as err:
        if err.stderr:
            raise
        staged = True
    if staged:
        git(["commit", "--no-verify", "--quiet", "-m",
             f"agent-cli-gateway: job {job_id} ({ended})\n\nWhat the job's CLI changed in its "
             f"worktree, committed by the gateway."], place, env=author_env(job_id), lfs=lfs)
    return git_text(["rev-parse", "--verify", f"refs/heads/{plan.branch}"],
                    repository(plan.common_dir))


def finish_worktree(plan: WorktreePlan, job_id: str, ended: str,
                    lfs: bool = False) -> dict[str, Any]:
    """Verify, commit, measure, and keep or remove the job's worktree. Never raises: a
    problem is reported in the answer (`error`) and the worktree is kept for a person; one
    not as the gateway made it is `tampered`, and git is not run in it at all."""
    report: dict[str, Any] = {"path": plan.path, "branch": plan.branch,
                              "base_sha": plan.base_sha, "changed": None, "files_changed": 0,
                              "insertions": 0, "deletions": 0, "state": KEPT_SHOWN}
    record = records.read_record(Path(plan.path))
    if record is not None and record.job_id != job_id:
        record = None  # the job can write its record: it decides nothing, and is not kept
    try:
        problems = tampering(plan) if Path(plan.path).exists() else []
    except OSError as exc:
        problems = [f"the worktree cannot be checked ({exc.strerror or exc})"]
    if problems:
        return _tampered(plan, job_id, record, report, problems)
    try:
        if not Path(plan.path).is_dir():
            raise GitError(f"the worktree {plan.path!r} is gone")
        head = commit_worktree(plan, job_id, ended, lfs)
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
        try:
            with repository_lock(plan.common_dir):
                remove_worktree(plan)
        except WorktreeError as exc:  # tampered between the commit and now
            return _tampered(plan, job_id, record, report, [str(exc)])
        if record is not None:
            record.delete()
        report.update(removed=True, state=REMOVED_SHOWN, path=None)
    elif record is not None:
        record.state, record.ended_at, record.head_sha = records.KEPT, time.time(), head
        record.files_changed, record.insertions, record.deletions = files, plus, minus
        record.save()
    log.info("worktree settled", action="worktree_settle", job_id=job_id, changed=changed,
             files_changed=files)
    return report


def _tampered(plan: WorktreePlan, job_id: str, record: records.WorktreeRecord | None,
              report: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """A worktree the job changed behind git's back (its `.git`, its admin dir, a symlink
    for a directory): nothing is committed or removed, the checkout is untouched, and the
    branch is left for a person; the job's result and the log say what was wrong."""
    report.update(state=TAMPERED_SHOWN, tampered=problems,
                  error="the worktree is not as the gateway made it, so nothing was committed "
                        "or removed; look at it and its branch yourself: "
                        + "; ".join(problems))
    log.warning("worktree tampered with: not committed, not removed",
                action="worktree_tampered", job_id=job_id, path=plan.path, problems=problems)
    if record is not None:
        record.state, record.ended_at = records.TAMPERED, time.time()
        with contextlib.suppress(OSError):  # the report says it; the record is a mirror
            record.save()
    return report


async def settle_worktree(plan: WorktreePlan | None, job_id: str, ended: str,
                          lfs: bool = False) -> dict[str, Any] | None:
    """The end of a run for an isolated job: commit, measure, keep or remove; the report is
    the job's `worktree` (None: the job is not isolated). Off the event loop; never raises,
    so the terminal write happens whatever git did."""
    if plan is None:
        return None
    try:
        return await asyncio.to_thread(finish_worktree, plan, job_id, ended, lfs)
    except Exception as exc:
        log.exception("worktree settle failed", action="worktree_settle", job_id=job_id)
        return {"path": plan.path, "branch": plan.branch, "base_sha": plan.base_sha,
                "changed": None, "files_changed": 0, "insertions": 0, "deletions": 0,
                "error": str(exc)}


def worktree_of(request_json: str | None, result_json: str | None) -> dict[str, Any] | None:
    """What a status or result shows as `worktree`: the outcome once the run ended, else
    the plan (changed: null); with `state` as the worktree's record on this host says now
    (the row's report is written once, at the run's end, and would go stale), and `path`
    null once the directory is gone. Off this host, or without a record, the report's."""
    plan = plan_of(request_json)
    ended = _ended_report(result_json)
    if ended is not None:
        shown = dict(ended)
        shown.setdefault("state", REMOVED_SHOWN if shown.get("removed") else KEPT_SHOWN)
    elif plan is not None:
        shown = {"path": plan.path, "branch": plan.branch, "base_sha": plan.base_sha,
                 "changed": None, "files_changed": None, "insertions": None,
                 "deletions": None, "state": PLANNED_SHOWN}
    else:
        return None
    record = _own_record(plan)
    # After the end a record still `creating`/`running` is one whose settling failed: the
    # report (with its error) says more than the record; and a tampered worktree stays
    # tampered whatever its record (which the job can write) says since.
    if shown["state"] == TAMPERED_SHOWN:
        record = None
    if record is not None and (ended is None or record.state not in records.ACTIVE_STATES):
        shown["state"] = _SHOWN_STATE.get(record.state, record.state)
    if shown["state"] in GONE_SHOWN:
        shown["path"] = None
    return shown


def _own_record(plan: WorktreePlan | None) -> records.WorktreeRecord | None:
    """The record of this job's worktree, if this host has one (a record at that path of
    another job says nothing about this one)."""
    if plan is None:
        return None
    record = records.read_record(Path(plan.path))
    return record if record is not None and record.job_id == plan.job_id else None


def _ended_report(result_json: str | None) -> dict[str, Any] | None:
    if not result_json:
        return None
    try:
        parsed = json.loads(result_json)
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get(WORKTREE_KEY), dict):
        report: dict[str, Any] = parsed[WORKTREE_KEY]
        return report
    return None
