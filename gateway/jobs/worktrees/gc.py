"""Retention and listing of the worktrees this host made (`worktrees list|gc`, the sweep).

Only what a record names is ever removed, and only on the host the record names: a
directory the gateway did not make is not the gateway's (a peer's `rm -rf` of every
worktree dir was a data-loss bug). A worktree with changes loses its directory after
`[worktrees] retention_h`; its branch, the job's commit, stays until applied or discarded.
A worktree whose job never reached its end (state `creating` or `running` with no gateway
left to finish it) is kept, shown, for a person.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gateway.config import Settings
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.create import (
    WorktreeError,
    git_quiet,
    remove_worktree,
    repository_lock,
    worktree_root,
)

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class WorktreeEntry:
    record: records.WorktreeRecord
    size_bytes: int | None
    age_s: float
    present: bool

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {"path": r.path, "branch": r.branch, "job_id": r.job_id, "state": r.state,
                "host": r.host, "base_sha": r.base_sha, "head_sha": r.head_sha,
                "size_bytes": self.size_bytes, "age_s": round(self.age_s, 1),
                "present": self.present, "files_changed": r.files_changed}


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
                   now: float | None = None) -> list[WorktreeEntry]:
    """This host's gateway-made worktrees, oldest first (not the tombstones of applied or
    discarded ones: nothing of those is left on disk)."""
    moment = time.time() if now is None else now
    entries = []
    for record in records.all_records(worktree_root(settings)):
        if record.host != hostname or record.state in records.TOMBSTONE_STATES:
            continue
        present = Path(record.path).is_dir()
        entries.append(WorktreeEntry(
            record=record, size_bytes=disk_size(Path(record.path)) if sizes and present else None,
            age_s=moment - (record.ended_at or record.created_at), present=present))
    return entries


def expire_worktrees(settings: Settings, hostname: str, now: float | None = None) -> list[str]:
    """Remove the directory of each finished worktree past retention_h (its branch stays);
    returns the paths removed."""
    moment = time.time() if now is None else now
    limit_s = settings.worktrees.retention_h * 3600
    removed = []
    for record in records.all_records(worktree_root(settings)):
        if record.host != hostname or record.state != records.KEPT:
            continue
        if record.ended_at is None or moment - record.ended_at < limit_s:
            continue
        try:
            with repository_lock(record.common_dir):
                git_quiet(["worktree", "unlock", record.path], record.toplevel)
                remove_worktree(record.toplevel, record.path, branch=None)
        except WorktreeError as exc:  # its repository is gone or busy: the next pass
            log.warning("worktree past retention not removed", action="worktree_gc",
                        job_id=record.job_id, error=str(exc))
            continue
        record.state = records.BRANCH_ONLY
        record.save()
        removed.append(record.path)
        log.info("worktree past retention removed; its branch stays", action="worktree_gc",
                 job_id=record.job_id, path=record.path, branch=record.branch)
    return removed
