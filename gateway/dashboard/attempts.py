"""The Attempts pages: the list of attempt groups and one group's comparison, its diffs side
by side (per file, one column per attempt) and its winner; with --allow-actions the pick,
through llm_attempts_pick's own code (gateway/jobs/attempts/pick.py), as `attempts pick`.

The comparison is `llm_attempts_status`'s (comparison.py): the page shows what the tool
answers, it ranks nothing itself.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from gateway import proc
from gateway.config import Settings
from gateway.dashboard import views
from gateway.jobs.attempts.comparison import comparison
from gateway.jobs.attempts.pick import pick
from gateway.jobs.manager import JobManager
from gateway.jobs.worktrees import changes
from gateway.model import GatewayError, JobRow, JobStatus
from gateway.store.attempts import PICKABLE, AttemptGroupRow
from gateway.store.base import JobStore
from neutral.durations import duration

GROUPS_SHOWN = 100  # the list page: the newest groups
PROMPT_CHARS = 120
DIFF_MAX_BYTES = 200_000  # one attempt's diff on the group page (the rest: `jobs diff`)
DONE = {"apply": "The attempt's changes were applied to the checkout; the others were "
                 "discarded.",
        "keep": "The attempt's branch was kept; the others were discarded.",
        "discard": "Every attempt's worktree and branch were discarded."}


@dataclass(frozen=True, slots=True)
class GroupLine:
    """One row of the groups list."""

    group_id: str
    status: str
    age: str
    base_sha: str
    attempts: int
    prompt: str
    winner: str


def group_line(group: AttemptGroupRow, attempts: int, now: float) -> GroupLine:
    return GroupLine(
        group_id=group.group_id, status=str(group.status),
        age=duration(now - group.created_at) if group.created_at else "-",
        base_sha=group.base_sha[:12], attempts=attempts,
        prompt=views.shown(views.first_line(group.prompt))[:PROMPT_CHARS],
        winner=(group.winner_job_id or "")[:8])


async def group_lines(store: JobStore) -> list[GroupLine]:
    now = await store.now()
    groups = await store.list_attempt_groups(limit=GROUPS_SHOWN)
    return [group_line(g, len(await store.list_attempts(g.group_id)), now) for g in groups]


def _check(row: dict[str, Any]) -> tuple[str, str]:
    """The check column: its text and its css class (pass, fail, none)."""
    check = row.get("check")
    if check is None:
        return f"no check ({views.shown(str(row.get('check_skipped') or '-'))})", "none"
    if check["passed"]:
        return "passed", "pass"
    code = check["exit_code"]
    return (f"failed (exit {code})" if code is not None
            else f"failed ({views.shown(str(check.get('reason') or '-'))})"), "fail"


@dataclass(frozen=True, slots=True)
class AttemptLine:
    """One row of the comparison table."""

    job_id: str
    rank: str
    provider: str
    model: str
    status: str
    check: str
    check_class: str
    check_tail: str
    diffstat: str
    applies: str
    cost: str
    ran: str
    winner: bool
    pickable: bool  # ended with changes: apply / keep offered

    @property
    def short_id(self) -> str:
        return self.job_id[:8]


def attempt_line(row: dict[str, Any], winner: str | None) -> AttemptLine:
    check, check_class = _check(row)
    tail = (row.get("check") or {}).get("output_tail") or ""
    found = row["changes"]
    applies = found.get("applies_cleanly")
    return AttemptLine(
        job_id=row["job_id"], rank="-" if row["rank"] is None else str(row["rank"]),
        provider=views.shown(row["provider"]), model=views.shown(row["model"] or "-"),
        status=row["status"], check=check, check_class=check_class,
        check_tail=views.shown(tail),
        diffstat=f"+{found['insertions']}/-{found['deletions']} in "
                 f"{found['files_changed']} files",
        applies="-" if applies is None else "yes" if applies else "no",
        cost=views.cost_of({"usage": row.get("usage") or {}}),
        ran=duration(row.get("duration_s")), winner=row["job_id"] == winner,
        pickable=JobStatus(row["status"]).is_terminal and found["files_changed"] > 0)


@dataclass(frozen=True, slots=True)
class FileColumns:
    """One changed file across the attempts: its lines in each attempt (None: unchanged
    there), in the order of the comparison table."""

    name: str
    cells: list[list[tuple[str, str]] | None]


async def _patch(row: JobRow) -> tuple[list[views.DiffFile], str]:
    try:
        page = await asyncio.to_thread(changes.diff, row, proc.hostname(), "patch", 0,
                                       DIFF_MAX_BYTES)
    except GatewayError as exc:
        return [], views.shown(exc.message)
    return views.diff_files(page.text), ""


async def side_by_side(store: JobStore, job_ids: list[str]) -> tuple[list[FileColumns],
                                                                     list[str]]:
    """Every file some attempt changed, each with one column per attempt; and why an
    attempt's diff could not be read (one note per attempt, "" when it could)."""
    per_attempt: list[dict[str, list[tuple[str, str]]]] = []
    notes: list[str] = []
    for job_id in job_ids:
        row = await store.get_job(job_id, with_output=False)
        files, note = await _patch(row) if row is not None else ([], "")
        per_attempt.append({f.name: f.lines for f in files})
        notes.append(note)
    names = sorted({name for files in per_attempt for name in files})
    return [FileColumns(name, [files.get(name) for files in per_attempt])
            for name in names], notes


async def group_page(store: JobStore, group: AttemptGroupRow) -> dict[str, Any]:
    """What the group page shows: the comparison's table, winner and judge, the diffs."""
    data = await comparison(store, proc.hostname(), group)
    winner = data.get("winner")
    winner_id = winner["job_id"] if winner else None
    lines = [attempt_line(row, winner_id) for row in data["attempts"]]
    files, notes = await side_by_side(store, [line.job_id for line in lines])
    judge = data.get("judge")
    usage = data["usage"]
    return {
        "group": {"id": group.group_id, "status": str(group.status),
                  "base_sha": group.base_sha, "until": group.until,
                  "prompt": views.shown(group.prompt),
                  "working_dir": views.shown(group.working_dir),
                  "check": views.shown(" ".join(group.check_argv or [])) or "none"},
        "lines": lines, "files": files, "notes": notes,
        "winner": ({"job_id": winner_id, "short": (winner_id or "")[:8],
                    "reason": views.shown(str(winner.get("reason") or ""))}
                   if winner else None),
        "judge": ({views.shown(str(k)): views.shown(str(v)) for k, v in judge.items()
                   if v is not None} if judge else None),
        "cost": f"${usage['cost_usd']:.4f}",
        "pickable": group.status in PICKABLE,
    }


async def do_pick(settings: Settings, store: JobStore, group: AttemptGroupRow,
                  job_id: str | None, action: str) -> dict[str, Any]:
    """`attempts pick`'s act: a manager of this request alone (it drives no job; its
    cancel is the store's request to the gateways running the attempts), then pick()."""
    manager = JobManager(settings, store, f"dashboard-{uuid.uuid4()}", proc.hostname(),
                         proc.boot_id())
    return await pick(manager, group, job_id if action != "discard" else None, action)
