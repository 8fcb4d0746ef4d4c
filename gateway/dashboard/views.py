"""Rows as the pages show them: every string that came from a CLI, a prompt or a path is made
safe for a person here (terminal escapes stripped, other control characters shown, as
`jobs show` does); the templates' autoescaping then makes it safe for HTML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.jobs.job_views import prompt_of, ran_for, request_of
from gateway.jobs.worktrees.finish import worktree_of
from gateway.model import InstanceRow, JobRow
from neutral.durations import duration
from neutral.visible import visible
from providers.parsing import strip_ansi

PROMPT_CHARS = 120  # the jobs table's prompt column: its first line, cut here


def shown(text: str | None) -> str:
    """Job data for a page: escape sequences (colours, titles, OSC 52) removed, any other
    control character made visible (`^[`, `<9b>`, `<U+202E>`)."""
    return visible(strip_ansi(text or ""))


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def result_fields(row: JobRow) -> dict[str, Any]:
    """result_json as an object ({} when there is none or it is not one)."""
    try:
        parsed = json.loads(row.result_json) if row.result_json else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def cost_of(result: dict[str, Any]) -> str:
    usage = result.get("usage")
    cost = usage.get("cost_usd") if isinstance(usage, dict) else None
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        return f"${cost:.4f}"
    return "-"


@dataclass(frozen=True, slots=True)
class JobLine:
    """One row of the jobs table."""

    id: str
    status: str
    provider: str
    model: str
    age: str
    ran: str
    cost: str
    host: str
    instance: str
    prompt: str
    worktree: str
    cancel_requested: bool

    @property
    def short_id(self) -> str:
        return self.id[:8]


def job_line(row: JobRow, now: float) -> JobLine:
    worktree = worktree_of(row.request_json, row.result_json) if '"worktree"' in (
        row.request_json or "") else None
    created = row.created_at.timestamp() if row.created_at else None
    return JobLine(
        id=row.id, status=row.status.value, provider=shown(row.provider),
        model=shown(row.model or "-"),
        age=duration(now - created) if created is not None else "-",
        ran=duration(ran_for(row, now)), cost=cost_of(result_fields(row)),
        host=shown(row.hostname or "-"), instance=shown((row.owner_instance or "-")[:12]),
        prompt=shown(first_line(prompt_of(row)))[:PROMPT_CHARS],
        worktree=shown(str(worktree.get("state") or "-")) if worktree else "",
        cancel_requested=row.cancel_requested_at is not None)


@dataclass(frozen=True, slots=True)
class Step:
    """One point of a job's status timeline."""

    label: str
    at: str


def timeline(row: JobRow) -> list[Step]:
    """Admitted, then what the row records in the order it happened (re-queued, adopted,
    started, cancel requested), then how it ended. The adopter is named only while it is
    still the owner the adoption made (no later re-queue or worker claim moved the job on)."""
    middle: list[tuple[datetime, str]] = []
    if row.requeued_at is not None:
        middle.append((row.requeued_at, f"re-queued ({row.requeue_count}x)"))
    if row.adopted_at is not None:
        middle.append((row.adopted_at, _adopted_label(row, row.adopted_at)))
    if row.started_at is not None:
        middle.append((row.started_at, "started"))
    if row.cancel_requested_at is not None:
        middle.append((row.cancel_requested_at, "cancel requested"))
    steps = [Step("admitted", when(row.created_at))]
    steps += [Step(label, when(at)) for at, label in sorted(middle, key=lambda step: step[0])]
    if row.status.is_terminal:
        steps.append(Step(row.status.value, when(row.finished_at)))
    return steps


def _adopted_label(row: JobRow, adopted_at: datetime) -> str:
    moved_on = any(later is not None and later > adopted_at
                   for later in (row.requeued_at, row.claimed_at))
    if moved_on or not row.owner_instance:
        return "adopted"
    return f"adopted (by {shown(row.owner_instance[:8])})"


def job_detail(row: JobRow, now: float) -> dict[str, Any]:
    """What the job page shows beside the tail and the diff."""
    request = request_of(row)
    result = result_fields(row)
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else None
    worktree = worktree_of(row.request_json, row.result_json)
    return {
        "line": job_line(row, now),
        "prompt": shown(prompt_of(row)),
        "request": shown(json.dumps({k: v for k, v in request.items() if k != "prompt"},
                                    indent=2, sort_keys=True, ensure_ascii=False)),
        "working_dir": shown(row.working_dir or "-"),
        "timeline": timeline(row),
        "usage": {shown(str(k)): shown(str(v)) for k, v in sorted(usage.items())} if usage else {},
        "error": shown(row.error) if row.error else "",
        "error_kind": shown(row.error_kind or ""),
        "exit_code": row.exit_code,
        "stderr_tail": shown(row.stderr_tail) if row.stderr_tail else "",
        "worktree": {shown(str(k)): shown(str(v)) for k, v in worktree.items()} if worktree else None,
        "terminal": row.status.is_terminal,
        "active": row.status.is_active,
    }


@dataclass(frozen=True, slots=True)
class DiffFile:
    """One file's section of a worktree diff."""

    name: str
    lines: list[tuple[str, str]]  # (css class, text)


def diff_files(patch: str) -> list[DiffFile]:
    """A `git diff` patch split per file, each line with its kind (add, del, hunk, meta)."""
    files: list[DiffFile] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            name = line.split(" b/", 1)[-1] if " b/" in line else line[len("diff --git "):]
            files.append(DiffFile(shown(name), []))
        if not files:
            continue
        kind = ("hunk" if line.startswith("@@") else
                "meta" if line.startswith(("diff --git", "index ", "--- ", "+++ ", "new file",
                                           "deleted file", "similarity", "rename")) else
                "add" if line.startswith("+") else "del" if line.startswith("-") else "ctx")
        files[-1].lines.append((kind, shown(line)))
    return files


@dataclass(frozen=True, slots=True)
class InstanceLine:
    instance_id: str
    hostname: str
    pid: str
    role: str
    version: str
    heartbeat: str
    lease: str
    renewal: str
    active_jobs: int


def instance_line(instance: InstanceRow, state: str, active_jobs: int, now: float) -> InstanceLine:
    beat = instance.heartbeat_at
    wait = instance.renewal_wait_ms_max_1h
    return InstanceLine(
        instance_id=shown(instance.instance_id), hostname=shown(instance.hostname),
        pid=str(instance.pid), role=shown(instance.role), version=shown(instance.version),
        heartbeat=f"{duration(now - beat.timestamp())} ago" if beat else "-",
        lease=state, renewal="-" if wait is None else f"{wait:.0f} ms", active_jobs=active_jobs)
