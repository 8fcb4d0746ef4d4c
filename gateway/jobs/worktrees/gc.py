"""Retention and listing of the worktrees this host made (`worktrees list|gc`, the sweep).

What is removed, and where, comes from the store, never from a file a job can write (#38):
a record beside a worktree (which the job can rewrite: any `path`, `state = kept`,
`ended_at = 1`) is only an index of which jobs made worktrees here. For each, the job's row
says the path (its plan, under the worktree root's real path), the host, that the job ended
and when; verify.py then checks the directory is the repository's registered worktree on the
job's branch, and it is removed without following a symlink. A record that disagrees with
its row is ignored, logged, and listed as `tampered`. A worktree with changes loses its
directory after `[worktrees] retention_h` from the job's end; its branch, the job's commit,
stays until applied or discarded. A worktree whose job never reached its end is kept, shown,
for a person.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gateway.config import Settings
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.create import (
    WorktreeError,
    WorktreePlan,
    plan_of,
    remove_worktree,
    repository_lock,
    worktree_root,
)
from gateway.model import JobRow
from gateway.store.base import JobStore

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class WorktreeEntry:
    record: records.WorktreeRecord
    size_bytes: int | None
    age_s: float
    present: bool
    tampered: str | None = None  # how the record disagrees with its job's row

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        shown = {"path": r.path, "branch": r.branch, "job_id": r.job_id, "state": r.state,
                 "host": r.host, "base_sha": r.base_sha, "head_sha": r.head_sha,
                 "size_bytes": self.size_bytes, "age_s": round(self.age_s, 1),
                 "present": self.present, "files_changed": r.files_changed}
        if self.tampered is not None:
            shown.update(state=records.TAMPERED, tampered=self.tampered)
        return shown


def disagreement(record: records.WorktreeRecord, row: JobRow | None, hostname: str,
                 root: Path) -> str | None:
    """How a record disagrees with its job's row (None: it agrees). Only a record that
    agrees leads to its row's plan, and only the plan is ever acted on."""
    if row is None:
        return f"the store has no job {record.job_id}"
    if row.hostname != hostname:
        return f"job {row.id} ran on host {row.hostname!r}, not this one"
    plan = plan_of(row.request_json)
    if plan is None:
        return f"job {row.id} did not run isolated"
    if os.path.normpath(record.path) != os.path.normpath(plan.path):
        return f"the record names {record.path!r}, job {row.id}'s worktree is {plan.path!r}"
    if Path(plan.path).parent.parent != root:
        return f"{plan.path!r} is not under the worktree root {str(root)!r}"
    return None


def disk_size(path: Path) -> int:
    """Bytes of the regular files under path (symlinks are not followed)."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(Path(entry.path))
                    elif stat.S_ISREG(info.st_mode):
                        total += info.st_size
        except OSError:
            continue
    return total


def list_worktrees(settings: Settings, hostname: str, sizes: bool = True,
                   now: float | None = None,
                   rows: Mapping[str, JobRow | None] | None = None) -> list[WorktreeEntry]:
    """This host's gateway-made worktrees, oldest first (not the tombstones of applied or
    discarded ones: nothing of those is left on disk). With `rows` (each record's job row,
    by job id), a record that disagrees with its row is marked tampered and its path is
    neither measured nor looked into."""
    moment = time.time() if now is None else now
    root = worktree_root(settings)
    entries = []
    for record in records.all_records(root):
        if record.host != hostname or record.state in records.TOMBSTONE_STATES:
            continue
        tampered = None if rows is None else disagreement(
            record, rows.get(record.job_id), hostname, root)
        present = tampered is None and Path(record.path).is_dir()
        entries.append(WorktreeEntry(
            record=record, size_bytes=disk_size(Path(record.path)) if sizes and present else None,
            age_s=moment - (record.ended_at or record.created_at), present=present,
            tampered=tampered))
    return entries


async def expire_worktrees(settings: Settings, hostname: str, store: JobStore,
                           now: float | None = None) -> list[str]:
    """Remove the directory of each finished worktree past retention_h from its job's end
    (its branch stays); returns the paths removed. Every fact acted on is the store's."""
    moment = time.time() if now is None else now
    limit_s = settings.worktrees.retention_h * 3600
    root = worktree_root(settings)
    removed = []
    for record in await asyncio.to_thread(records.all_records, root):
        if record.host != hostname or record.state != records.KEPT:
            continue  # the index only: a record it skips is one whose job is not done
        row = await store.get_job(record.job_id, with_output=False)
        why = disagreement(record, row, hostname, root)
        if why is not None or row is None:
            log.warning("worktree record disagrees with its job's row; ignored",
                        action="worktree_gc", job_id=record.job_id, problem=why)
            continue
        plan = plan_of(row.request_json)
        if plan is None or not row.status.is_terminal or row.finished_at is None \
                or moment - row.finished_at.timestamp() < limit_s:
            continue
        if await asyncio.to_thread(_expire, plan, record):
            removed.append(plan.path)
    return removed


def _expire(plan: WorktreePlan, record: records.WorktreeRecord) -> bool:
    try:
        with repository_lock(plan.common_dir):
            remove_worktree(plan, branch=False)
    except WorktreeError as exc:  # tampered, or its repository is gone or busy
        log.warning("worktree past retention not removed", action="worktree_gc",
                    job_id=plan.job_id, error=str(exc))
        return False
    record.state = records.BRANCH_ONLY
    record.save()
    log.info("worktree past retention removed; its branch stays", action="worktree_gc",
             job_id=plan.job_id, path=plan.path, branch=plan.branch)
    return True
