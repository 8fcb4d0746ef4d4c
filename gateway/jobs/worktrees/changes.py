"""`llm_job_changes` and `jobs diff|apply|discard`: what an isolated job changed, for the caller.

- diff: the job's changes against its base_sha (`stat` or `patch`), paged like a result;
  a running job's so far (its worktree against the base).
- apply: the changes as uncommitted edits in the caller's checkout (a squash of the job's
  branch), or nothing at all: refused when a file it touches has changes in the checkout,
  or when the patch does not apply there (`git apply --check` first). Then the job's worktree
  and branch go: their work is in the checkout.
- discard: the worktree and the branch go.
Only on the job's host (the `hostname` column): another host's repository is not ours to
read or change, even where a path of the same name exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.create import (
    WorktreeError,
    WorktreePlan,
    plan_of,
    remove_worktree,
    repository_lock,
)
from gateway.jobs.worktrees.finish import worktree_of
from gateway.jobs.worktrees.git import GitError, git, repository
from gateway.jobs.worktrees.verify import place_of, tampering
from gateway.model import ErrorKind, GatewayError, JobRow
from neutral.utf8 import char_boundary

log = structlog.get_logger(__name__)

SHOWN_FILES = 20  # files named in a refusal


@dataclass(slots=True)
class DiffPage:
    text: str
    offset: int
    next_offset: int | None
    total_bytes: int
    tip: str  # the commit (or "worktree" for a running job) the diff is taken to


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def _own_plan(row: JobRow, hostname: str) -> WorktreePlan:
    plan = plan_of(row.request_json)
    if plan is None:
        raise _invalid(f"Job {row.id} did not run isolated (isolation = \"worktree\"): it has "
                       f"no worktree or branch; its changes are in {row.working_dir!r} already.")
    if row.hostname != hostname:
        raise _invalid(f"Job {row.id}'s worktree is on host {row.hostname!r}, not this one "
                       f"({hostname!r}); ask a gateway on that host.")
    return plan


def _branch_tip(plan: WorktreePlan) -> str | None:
    try:
        return git(["rev-parse", "--verify", "--quiet", f"refs/heads/{plan.branch}"],
                   repository(plan.common_dir)).decode().strip() or None
    except GitError:
        return None


_WHY_GONE = {
    "removed": "the run changed nothing, so its worktree and branch were removed",
    "applied": "its changes were applied already",
    "discarded": "it was discarded already",
}


def _gone(row: JobRow, plan: WorktreePlan) -> GatewayError:
    shown = worktree_of(row.request_json, row.result_json) or {}
    why = _WHY_GONE.get(shown.get("state", ""), "the branch was deleted outside the gateway")
    return _invalid(f"Job {row.id} has no branch {plan.branch!r} any more: {why}.")


def diff(row: JobRow, hostname: str, fmt: str = "stat", offset: int = 0,
         max_bytes: int = 200_000) -> DiffPage:
    """A page of the job's diff against base_sha (UTF-8 byte offsets, never a split char)."""
    if fmt not in ("stat", "patch"):
        raise _invalid(f"format must be \"stat\" or \"patch\"; got {fmt!r}.")
    if offset < 0 or max_bytes < 1:
        raise _invalid("offset must be >= 0 and max_bytes >= 1.")
    plan = _own_plan(row, hostname)
    shape = ["--stat"] if fmt == "stat" else ["--patch"]
    common = ["--no-color", *shape]
    try:
        if row.status.is_active:
            if not Path(plan.path).is_dir():
                raise _invalid(f"Job {row.id} is {row.status} and its worktree is not made "
                               f"yet; ask again in a moment.")
            problems = tampering(plan)
            if problems:
                raise GatewayError(ErrorKind.WORKTREE_ERROR, f"Job {row.id}'s worktree is not "
                                   f"as the gateway made it: {'; '.join(problems)}.")
            data = git(["diff", *common, plan.base_sha, "--"], place_of(plan))
            tip = "worktree"
        else:
            branch_tip = _branch_tip(plan)
            if branch_tip is None:
                raise _gone(row, plan)
            data = git(["diff", *common, plan.base_sha, branch_tip, "--"],
                       repository(plan.common_dir))
            tip = branch_tip
    except GitError as err:
        raise GatewayError(ErrorKind.WORKTREE_ERROR, f"git could not diff job {row.id}: "
                           f"{err.message}") from None
    return page_of(data, offset, max_bytes, tip)


def page_of(data: bytes, offset: int, max_bytes: int, tip: str) -> DiffPage:
    """A page of a diff at UTF-8 byte offsets, never a split character."""
    total = len(data)
    start = char_boundary(data, min(offset, total))
    end = char_boundary(data, min(total, start + max_bytes))
    if end == start and start < total:
        end = char_boundary(data, start + 1, forward=True)
    return DiffPage(text=data[start:end].decode("utf-8", "replace"), offset=start,
                    next_offset=end if end < total else None, total_bytes=total, tip=tip)


def _paths(data: bytes) -> list[str]:
    return [p.decode("utf-8", "surrogateescape") for p in data.split(b"\0") if p]


def dirty_paths(toplevel: str) -> set[str]:
    """Every path with changes in the checkout: staged, unstaged, untracked (both sides of
    a rename)."""
    out = git(["status", "--porcelain=v1", "-z", "--untracked-files=all"], toplevel,
              env={"GIT_OPTIONAL_LOCKS": "0"})
    dirty: set[str] = set()
    fields = out.split(b"\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        dirty.add(entry[3:].decode("utf-8", "surrogateescape"))
        if entry[:1] in (b"R", b"C"):  # the next field is the rename's source
            dirty.add(fields[i].decode("utf-8", "surrogateescape"))
            i += 1
    return dirty


def _terminal_plan(row: JobRow, hostname: str, action: str) -> WorktreePlan:
    plan = _own_plan(row, hostname)
    if row.status.is_active:
        raise _invalid(f"Job {row.id} is still {row.status}; {action} it once it has ended "
                       f"(llm_job_wait), or cancel it first.")
    return plan


def _refuse_tampered(plan: WorktreePlan, job_id: str, action: str) -> None:
    """Nothing is done for a job whose worktree is not as the gateway made it: its
    removal, the last step of apply and discard, would be refused half-way."""
    problems = tampering(plan) if os.path.lexists(plan.path) else []
    if problems:
        raise _invalid(f"Not {action}, nothing changed: job {job_id}'s worktree is not as the "
                       f"gateway made it ({'; '.join(problems)}). Look at it and its branch "
                       f"{plan.branch!r} yourself.")


def apply(row: JobRow, hostname: str) -> dict[str, Any]:
    """Bring the job's changes into its working_dir's checkout as uncommitted edits, or
    change nothing and say why (GatewayError)."""
    plan = _terminal_plan(row, hostname, "apply")
    tip = _branch_tip(plan)
    if tip is None:
        raise _gone(row, plan)
    _refuse_tampered(plan, row.id, "applied")
    try:
        files = _paths(git(["diff", "--name-only", "--no-renames", "-z", plan.base_sha, tip,
                            "--"], repository(plan.common_dir)))
        if not files:
            raise _invalid(f"Job {row.id}'s branch has no changes against its base; nothing "
                           f"to apply (discard it instead).")
        with repository_lock(plan.common_dir):
            clash = sorted(set(files) & dirty_paths(plan.toplevel))
            if clash:
                raise _invalid(
                    f"Not applied, nothing changed: the checkout {plan.toplevel!r} has "
                    f"uncommitted changes to files job {row.id} also changed: "
                    f"{clash[:SHOWN_FILES]}. Commit or stash them, then apply again.")
            patch = git(["diff", "--binary", "--full-index", "--no-renames", "--no-color",
                         plan.base_sha, tip, "--"], repository(plan.common_dir))
            try:
                git(["apply", "--check", "--whitespace=nowarn", "-"], plan.toplevel,
                    input_bytes=patch)
            except GitError as err:
                raise _invalid(f"Not applied, nothing changed: job {row.id}'s changes do not "
                               f"apply to the checkout {plan.toplevel!r} as it is now "
                               f"({err.stderr[:400]}). Diff them with llm_job_changes("
                               f"action=\"diff\", format=\"patch\") and merge by hand, or "
                               f"`git merge {plan.branch}`.") from None
            git(["apply", "--whitespace=nowarn", "-"], plan.toplevel, input_bytes=patch)
            _remove(plan, row.id, records.APPLIED, hostname)
    except GitError as err:
        raise GatewayError(ErrorKind.WORKTREE_ERROR, f"git failed applying job {row.id}: "
                           f"{err.message}") from None
    except WorktreeError as err:
        raise GatewayError(ErrorKind.WORKTREE_ERROR, str(err)) from None
    return {"applied": True, "files": files, "commit": tip, "checkout": plan.toplevel,
            "branch_removed": plan.branch}


def applies_cleanly(row: JobRow, hostname: str) -> bool | None:
    """Whether `apply` would bring the job's changes into its checkout now, as apply itself
    decides it (no clash with uncommitted work, `git apply --check`), changing nothing:
    the evidence an attempt group's comparison shows. None: it cannot be told (not an
    ended isolated job of this host, no branch, no changes, git failing)."""
    try:
        plan = _terminal_plan(row, hostname, "compare")
        tip = _branch_tip(plan)
        if tip is None:
            return None
        files = _paths(git(["diff", "--name-only", "--no-renames", "-z", plan.base_sha, tip,
                            "--"], repository(plan.common_dir)))
        if not files:
            return None
        if set(files) & dirty_paths(plan.toplevel):
            return False
        patch = git(["diff", "--binary", "--full-index", "--no-renames", "--no-color",
                     plan.base_sha, tip, "--"], repository(plan.common_dir))
    except (GatewayError, GitError, OSError):
        return None
    try:
        git(["apply", "--check", "--whitespace=nowarn", "-"], plan.toplevel, input_bytes=patch)
    except GitError:
        return False
    return True


def discard(row: JobRow, hostname: str) -> dict[str, Any]:
    """Remove the job's worktree and branch (its changes are gone)."""
    plan = _terminal_plan(row, hostname, "discard")
    tip = _branch_tip(plan)
    present = os.path.lexists(plan.path)
    if tip is None and not present:
        raise _gone(row, plan)
    try:
        with repository_lock(plan.common_dir):
            _refuse_tampered(plan, row.id, "discarded")
            _remove(plan, row.id, records.DISCARDED, hostname)
    except WorktreeError as err:
        raise GatewayError(ErrorKind.WORKTREE_ERROR, str(err)) from None
    return {"discarded": True, "branch": plan.branch, "commit": tip,
            "path": plan.path if present else None}


def _remove(plan: WorktreePlan, job_id: str, outcome: str, hostname: str) -> None:
    """Worktree and branch of a job; its record stays as a tombstone saying `outcome`
    (APPLIED or DISCARDED), which the job's status shows. The caller holds the lock."""
    record = records.read_record(Path(plan.path))
    if record is not None and record.job_id != job_id:
        raise WorktreeError(f"{plan.path!r} belongs to job {record.job_id}, not {job_id}")
    remove_worktree(plan)
    if record is None:  # made before records, or lost: the tombstone is written anyway
        record = records.WorktreeRecord(
            job_id=job_id, host=hostname, instance=plan.instance, path=plan.path,
            branch=plan.branch, base_sha=plan.base_sha, common_dir=plan.common_dir,
            toplevel=plan.toplevel)
    try:
        record.bury(outcome)
    except OSError as exc:  # the work is done; only the status's account of it is missing
        log.warning("worktree tombstone not written", action="worktree_bury", job_id=job_id,
                    error=str(exc))
