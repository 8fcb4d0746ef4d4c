"""What the gateway knows of each worktree it made, on the disk of the host that owns it.

A record (`<root>/<repo key>/<job id prefix>.json`, beside the worktree's directory) is
written before `git worktree add` and kept up to date at each step: so `worktrees list`,
`worktrees gc` and the quota see every worktree this host made, and only those (a directory
without a record is never the gateway's to remove), with no store at hand; and a second
attempt of the same job can tell its own leftovers from a stranger's. The job's row carries
the same facts for callers (`request_json["worktree"]` from admission, `result_json["worktree"]`
once the run ended); the host is part of the record, and nothing acts on a record of another.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.fs import write_private_atomically

RECORD_VERSION = 1
RECORD_SUFFIX = ".json"

# The states of a record, in order. The record of a worktree removed because its run
# changed nothing is deleted; one applied or discarded stays, as a small tombstone, so the
# job's status can say what became of its worktree (#27) rather than show a path long gone.
CREATING = "creating"  # written before `git worktree add`: whatever exists is this attempt's
RUNNING = "running"  # made, verified and locked; the CLI runs (or ran: the end not yet seen)
KEPT = "kept"  # the run ended with changes: directory and branch kept for retention_h
BRANCH_ONLY = "branch"  # past retention: the directory is gone, the branch stays
APPLIED = "applied"  # tombstone: brought into the caller's checkout; worktree and branch gone
DISCARDED = "discarded"  # tombstone: worktree and branch removed, the changes dropped
TAMPERED = "tampered"  # the job changed it behind git's back: not committed, nothing removed
ACTIVE_STATES = frozenset({CREATING, RUNNING})
TOMBSTONE_STATES = frozenset({APPLIED, DISCARDED})  # nothing of the worktree is left
ON_DISK_STATES = frozenset({CREATING, RUNNING, KEPT, TAMPERED})  # what the quota counts


@dataclass(slots=True)
class WorktreeRecord:
    job_id: str
    host: str
    instance: str
    path: str
    branch: str
    base_sha: str
    common_dir: str
    toplevel: str
    state: str = CREATING
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    head_sha: str | None = None
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0
    version: int = RECORD_VERSION

    @property
    def file(self) -> Path:
        return record_file(Path(self.path))

    def save(self) -> None:
        """Atomically (a rename), private to the user (0600)."""
        write_private_atomically(self.file, json.dumps(asdict(self), sort_keys=True).encode())

    def bury(self, state: str) -> None:
        """Keep the record as a tombstone (APPLIED or DISCARDED) once worktree and branch
        are gone."""
        self.state, self.ended_at = state, self.ended_at or time.time()
        self.save()

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.file.unlink()


def record_file(worktree_path: Path) -> Path:
    return worktree_path.with_name(worktree_path.name + RECORD_SUFFIX)


def read_record(worktree_path: Path) -> WorktreeRecord | None:
    """The record of the worktree at this path, or None (none, unreadable, a newer one)."""
    return _load(record_file(worktree_path))


def _load(file: Path) -> WorktreeRecord | None:
    try:
        data: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return None
    known = set(WorktreeRecord.__dataclass_fields__)
    try:
        return WorktreeRecord(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def repo_records(repo_dir: Path) -> list[WorktreeRecord]:
    """Every record under one repository's directory of the worktree root."""
    try:
        files = sorted(repo_dir.glob("*" + RECORD_SUFFIX))
    except OSError:
        return []
    return [r for r in (_load(f) for f in files) if r is not None]


def all_records(root: Path) -> list[WorktreeRecord]:
    """Every record under the worktree root, oldest first."""
    try:
        repos = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    records = [r for repo in repos for r in repo_records(repo)]
    return sorted(records, key=lambda r: r.created_at)
