"""Worktree jobs on another host (issue 42): the worker's side (which of its checkouts a
job's `repo` names, the job's base commit fetched when missing, the patch it stores at the
end) and the submitting host's side (diff and apply of that stored patch).

The patch is the branch's changes against base_sha, binary-safe (`git diff --binary
--full-index`), bounded by `[worker] max_patch_bytes`: over it, nothing is stored but the
size, and the branch stays on the worker. Apply follows the local rules (changes.py):
refused when a file it touches has changes in the checkout or when it does not apply
(`git apply --check` first), so nothing is ever half-applied.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import structlog

from gateway.config import Settings
from gateway.jobs.requests import stored_fields
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.changes import DiffPage, dirty_paths, page_of
from gateway.jobs.worktrees.create import (
    WorktreeError,
    WorktreePlan,
    remove_worktree,
    repository_lock,
    worktree_root,
)
from gateway.jobs.worktrees.git import GitError, git, git_text, repository
from gateway.model import ErrorKind, GatewayError, JobRow
from gateway.store.base import JobStore, StoreUnavailable
from gateway.store.protocol_roles import RemotePatch

log = structlog.get_logger(__name__)

SHOWN_FILES = 20  # files named in a refusal
# The transports a fetch of a missing base commit may use: the usual ones, never `ext::`
# (a command) or any other a repository's config could name.
FETCH_PROTOCOLS = ("-c", "protocol.https.allow=always", "-c", "protocol.ssh.allow=always",
                   "-c", "protocol.git.allow=always", "-c", "protocol.file.allow=always")


def origin_url(checkout: Path | str) -> str | None:
    """The checkout's `origin` URL (None: no origin, or not a checkout)."""
    try:
        return git_text(["config", "--get", "remote.origin.url"], checkout) or None
    except GitError:
        return None


def checkout_for(settings: Settings, repo: str) -> Path | None:
    """This host's checkout a job's `repo` names: a [worker] repos name, or the origin URL
    of one of them."""
    repos = settings.worker.repos
    if repo in repos:
        return repos[repo]
    for path in repos.values():
        if origin_url(path) == repo:
            return path
    return None


def ensure_commit(checkout: Path, sha: str) -> None:
    """Fetch `sha` from the checkout's origin when the checkout lacks it. Raises
    GatewayError(worktree_error) when it cannot be had: the job fails, nothing runs."""
    if _has_commit(checkout, sha):
        return
    with contextlib.suppress(GitError):
        git([*FETCH_PROTOCOLS, "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
             "origin", sha], checkout)
    if not _has_commit(checkout, sha):
        raise GatewayError(ErrorKind.WORKTREE_ERROR, (
            f"the job's base commit {sha} is not in this host's checkout {str(checkout)!r} "
            f"and could not be fetched from its origin; push it there (or fetch it on this "
            f"host) and submit again."))


def _has_commit(checkout: Path, sha: str) -> bool:
    try:
        return bool(git_text(["rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"],
                             checkout))
    except GitError:
        return False


def patch_of(plan: WorktreePlan, job_id: str, hostname: str,
             max_bytes: int) -> RemotePatch | None:
    """What the worker stores of a settled job's branch (None: no branch, nothing changed).
    Blocking: call it in a thread."""
    where = repository(plan.common_dir)
    try:
        tip = git_text(["rev-parse", "--verify", "--quiet", f"refs/heads/{plan.branch}"], where)
    except GitError:
        return None
    if not tip or tip == plan.base_sha:
        return None
    data = git(["diff", "--binary", "--full-index", "--no-renames", "--no-color",
                plan.base_sha, tip, "--"], where)
    return RemotePatch(job_id=job_id, hostname=hostname, base_sha=plan.base_sha, tip=tip,
                       size=len(data), patch=data if len(data) <= max_bytes else None)


async def store_patch(store: JobStore, plan: WorktreePlan, row: JobRow,
                      max_bytes: int) -> str:
    """Store the patch of a worktree job this worker ran, for its submitting host; what the
    job's `worktree.patch` says: "stored", "none" (nothing changed), "too_large" (the
    branch stays here) or "not_stored" (git or the store failed; the branch stays here)."""
    try:
        patch = await asyncio.to_thread(patch_of, plan, row.id, row.hostname or "", max_bytes)
        if patch is None:
            return "none"
        await store.put_patch(patch)
    except (GitError, StoreUnavailable) as exc:
        log.warning("patch not stored", action="store_patch", job_id=row.id, error=str(exc))
        return "not_stored"
    return "stored" if patch.patch is not None else "too_large"


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def _usable(patch: RemotePatch | None, job_id: str) -> bytes:
    if patch is None:
        raise _invalid(f"Job {job_id} ran on another host and stored no changes: it changed "
                       f"nothing, or has not ended yet.")
    if patch.patch is None:
        raise _invalid(f"Job {job_id}'s changes ({patch.size} bytes) were over the worker's "
                       f"[worker] max_patch_bytes: its branch is kept on host "
                       f"{patch.hostname!r} at {patch.tip}; fetch it from there.")
    return patch.patch


def is_remote_worktree(row: JobRow) -> bool:
    """A worktree job admitted for another host: its changes come back as a stored patch."""
    return row.runs_on is not None and \
        stored_fields(row.request_json).get("isolation") == "worktree"


def _own_submission(row: JobRow, hostname: str) -> str:
    """The submitting host's checkout (working_dir), only on that host: another host's
    checkout is not ours to change, even where a path of the same name exists."""
    submitted_on = stored_fields(row.request_json).get("submitted_on")
    if submitted_on != hostname or not row.working_dir:
        raise _invalid(f"Job {row.id} was submitted on host {submitted_on!r}, not this one "
                       f"({hostname!r}); ask a gateway on that host.")
    if row.status.is_active:
        raise _invalid(f"Job {row.id} is still {row.status}; its changes come back when it "
                       f"has ended (llm_job_wait).")
    return row.working_dir


async def remote_diff(store: JobStore, row: JobRow, hostname: str, fmt: str, offset: int,
                      max_bytes: int) -> DiffPage:
    """A page of the stored patch (`patch`) or of its stat (`git apply --stat`, which reads
    the patch only, never the checkout's files)."""
    if fmt not in ("stat", "patch"):
        raise _invalid(f"format must be \"stat\" or \"patch\"; got {fmt!r}.")
    checkout = _own_submission(row, hostname)
    patch = await store.get_patch(row.id)
    data = _usable(patch, row.id)
    assert patch is not None
    if fmt == "stat":
        try:
            data = await asyncio.to_thread(git, ["apply", "--stat", "-"], checkout,
                                           input_bytes=data)
        except GitError as err:
            raise GatewayError(ErrorKind.WORKTREE_ERROR, f"git could not read job {row.id}'s "
                               f"patch: {err.message}") from None
    return page_of(data, offset, max_bytes, patch.tip)


async def remote_apply(store: JobStore, row: JobRow, hostname: str) -> dict[str, Any]:
    """Apply the stored patch here, then ask the worker to remove its worktree."""
    checkout = _own_submission(row, hostname)
    patch = await store.get_patch(row.id)
    if patch is not None and patch.discard_requested:
        raise _invalid(f"Job {row.id}'s changes were applied or discarded already.")
    done = await asyncio.to_thread(_apply_patch, patch, row.id, checkout)
    done["worktree_removal_requested"] = await store.request_worktree_removal(row.id)
    return done


async def remote_discard(store: JobStore, row: JobRow, hostname: str) -> dict[str, Any]:
    """Ask the worker that holds the job's worktree to remove it."""
    _own_submission(row, hostname)
    patch = await store.get_patch(row.id)
    if patch is None:
        raise _invalid(f"Job {row.id} left no worktree on its worker (it changed nothing).")
    if not await store.request_worktree_removal(row.id):
        raise _invalid(f"Job {row.id}'s changes were applied or discarded already.")
    return {"discarded": True, "branch": None, "commit": patch.tip, "path": None,
            "worktree_host": patch.hostname}


def remove_requested(settings: Settings, job_ids: list[str], hostname: str) -> list[str]:
    """On the worker: remove the worktrees and branches of `job_ids` that submitting hosts
    applied or discarded; returns the ids done (or found gone). Blocking (git)."""
    wanted = set(job_ids)
    done = []
    for record in records.all_records(worktree_root(settings)):
        if record.job_id not in wanted or record.state in records.TOMBSTONE_STATES:
            continue
        plan = WorktreePlan(path=record.path, branch=record.branch, base_ref=record.base_sha,
                            base_sha=record.base_sha, common_dir=record.common_dir,
                            toplevel=record.toplevel, subdir="", job_id=record.job_id,
                            instance=record.instance)
        try:
            with repository_lock(plan.common_dir):
                remove_worktree(plan)
            record.bury(records.DISCARDED)
        except (WorktreeError, OSError) as exc:
            log.warning("remote worktree not removed", action="worktree_remove",
                        job_id=record.job_id, error=str(exc))
            continue
        done.append(record.job_id)
    seen = {r.job_id for r in records.all_records(worktree_root(settings))
            if r.state not in records.TOMBSTONE_STATES}
    return done + sorted(wanted - seen - set(done))


def _apply_patch(patch: RemotePatch | None, job_id: str, checkout: str) -> dict[str, Any]:
    """Apply the stored patch to the submitting host's checkout as uncommitted edits, or
    change nothing and say why. Blocking: call it in a thread."""
    data = _usable(patch, job_id)
    assert patch is not None
    try:
        toplevel = git_text(["rev-parse", "--show-toplevel"], checkout)
        files = [p.decode("utf-8", "surrogateescape").split("\t", 2)[-1]
                 for p in git(["apply", "--numstat", "-z", "-"], toplevel,
                              input_bytes=data).split(b"\0") if p]
        clash = sorted(set(files) & dirty_paths(toplevel))
        if clash:
            raise _invalid(f"Not applied, nothing changed: the checkout {toplevel!r} has "
                           f"uncommitted changes to files job {job_id} also changed: "
                           f"{clash[:SHOWN_FILES]}. Commit or stash them, then apply again.")
        try:
            git(["apply", "--check", "--whitespace=nowarn", "-"], toplevel, input_bytes=data)
        except GitError as err:
            raise _invalid(f"Not applied, nothing changed: job {job_id}'s changes do not "
                           f"apply to the checkout {toplevel!r} as it is now "
                           f"({err.stderr[:400]}). Diff them with llm_job_changes(action="
                           f"\"diff\", format=\"patch\") and merge by hand.") from None
        git(["apply", "--whitespace=nowarn", "-"], toplevel, input_bytes=data)
    except GitError as err:
        raise GatewayError(ErrorKind.WORKTREE_ERROR, f"git failed applying job {job_id}: "
                           f"{err.message}") from None
    return {"applied": True, "files": files, "commit": patch.tip, "checkout": toplevel,
            "worktree_host": patch.hostname}
