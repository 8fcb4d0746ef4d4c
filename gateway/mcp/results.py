"""How every MCP tool answers: readable text plus `structuredContent`, errors as `isError`.

One place decides the shape of an answer, so every tool speaks the same language: the job
table's snake_case column names (job_id, status, error_kind, exit_code, created_at, ...),
and on failure `error_kind`, `error`, `retryable` plus a text that says what to do next.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from gateway.model import RETRYABLE, ErrorKind, GatewayError, JobRow, JobStatus

STDERR_EXCERPT_CHARS = 2000  # enough of a CLI's stderr to see why it failed, not a flood


def ok(text: str, data: dict[str, Any]) -> CallToolResult:
    """A successful answer: `text` for a human or a model, `data` for a program."""
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=_jsonable(data))


def failure(kind: ErrorKind | str, message: str, *, text: str | None = None,
            **extra: Any) -> CallToolResult:
    """An `isError` answer a caller can branch on (`error_kind`, `retryable`)."""
    data: dict[str, Any] = {"error_kind": str(kind), "error": message,
                            "retryable": ErrorKind.of(kind) in RETRYABLE, **extra}
    shown = text if text is not None else f"Error ({kind}): {message}"
    return CallToolResult(content=[TextContent(type="text", text=shown)],
                          structured_content=_jsonable(data), is_error=True)


def from_gateway_error(err: GatewayError, **extra: Any) -> CallToolResult:
    return failure(err.kind, err.message, **extra)


def invalid_arguments(tool: str, exc: ValidationError) -> CallToolResult:
    """Pydantic's complaint about the arguments, without echoing the values (a prompt can be
    megabytes, and is the caller's data)."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{loc}: {msg}" if loc else msg)
    message = (f"Invalid arguments for {tool}: {'; '.join(problems)}. Fix them and call "
               f"{tool} again (the tool's input schema lists every argument).")
    return failure(ErrorKind.INVALID_INPUT, message)


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def parsed_result(row: JobRow) -> dict[str, Any] | None:
    """The job's parsed answer (text, native session id, usage, duration), if it has one."""
    if not row.result_json:
        return None
    try:
        parsed = json.loads(row.result_json)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def duration_s(row: JobRow, parsed: dict[str, Any] | None = None) -> float | None:
    if parsed and isinstance(parsed.get("duration_s"), (int, float)):
        return float(parsed["duration_s"])
    if row.started_at and row.finished_at:
        return round((row.finished_at - row.started_at).total_seconds(), 3)
    return None


def job_fields(row: JobRow) -> dict[str, Any]:
    """A job's public fields, named as in the `jobs` table (no request body, no output)."""
    parsed = parsed_result(row)
    fields: dict[str, Any] = {
        "job_id": row.id,
        "provider": row.provider,
        "status": str(row.status),
        "transport": row.transport,
        "model": row.model,
        "session_id": row.session_id,
        "working_dir": row.working_dir,
        "correlation_id": row.correlation_id,
        "owner_instance": row.owner_instance,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "exit_code": row.exit_code,
        "error_kind": row.error_kind,
        "error": row.error,
        "output_bytes": row.output_bytes,
        "truncated": row.truncated,
        "cancel_requested": row.cancel_requested_at is not None,
        "forced": row.forced,
        "duration_s": duration_s(row, parsed),
    }
    if row.runs_on is not None:  # a job for another host (issue 42): where and why not yet
        fields["runs_on"] = json.loads(row.runs_on)
        fields["hostname"] = row.hostname if row.claimed_at is not None else None
        if row.unschedulable_reason and row.status == JobStatus.QUEUED:
            fields["unschedulable_reason"] = row.unschedulable_reason
    if parsed is not None:
        fields["native_session_id"] = parsed.get("session_id")
        fields["usage"] = parsed.get("usage")
    # The worktree machinery loads with the tools, after the handshake, not with the server.
    from gateway.jobs.worktrees.finish import worktree_of  # deferred: start-up

    worktree = worktree_of(row.request_json, row.result_json)
    if worktree is not None:  # an isolated job (#27): its worktree, branch and changes
        fields["worktree"] = worktree
    if row.status.is_terminal and row.status != JobStatus.COMPLETED:
        fields["retryable"] = row.error_kind in RETRYABLE
    return fields


def stderr_excerpt(row: JobRow) -> str | None:
    if not row.stderr_tail:
        return None
    return row.stderr_tail[-STDERR_EXCERPT_CHARS:]


def describe_status(row: JobRow) -> str:
    """One sentence about where a job stands and what to call next."""
    job = f"Job {row.id} ({row.provider})"
    if row.status == JobStatus.QUEUED and row.runs_on is not None and row.claimed_at is None:
        why = f" ({row.unschedulable_reason})" if row.unschedulable_reason else ""
        return (f"{job} is queued, waiting for a worker host that meets runs_on{why}. Call "
                f"llm_job_wait(job_id=\"{row.id}\") to wait for it.")
    if row.status == JobStatus.QUEUED:
        return (f"{job} is queued, waiting for a free run slot. Call llm_job_wait(job_id="
                f"\"{row.id}\") to wait for it.")
    if row.status == JobStatus.RUNNING:
        return (f"{job} is running ({row.output_bytes} bytes of output so far). Call "
                f"llm_job_wait(job_id=\"{row.id}\") to wait for it, llm_job_cancel to stop it.")
    if row.status == JobStatus.COMPLETED:
        took = duration_s(row, parsed_result(row))
        took_text = f" in {took:g} s" if took is not None else ""
        return (f"{job} completed{took_text} (exit code {row.exit_code}). Fetch the answer with "
                f"llm_job_result(job_id=\"{row.id}\").")
    kind = f" ({row.error_kind})" if row.error_kind else ""
    error = f": {row.error}" if row.error else "."
    return (f"{job} {row.status}{kind}{error} Its output, if any, is readable with "
            f"llm_job_result(job_id=\"{row.id}\", raw=true).")


def next_call(tool: str, why: str, **arguments: Any) -> dict[str, Any]:
    """The call a caller should make next, as data: some clients (Claude Code, Codex) hand
    the model only `structuredContent`, never the readable text that also says it."""
    return {"tool": tool, "arguments": arguments, "why": why}


def follow_up(row: JobRow) -> dict[str, Any] | None:
    """What to call next for a job in this state: wait while it is active, read a
    completed job's answer, nothing after a failure (its error says what to do)."""
    if row.status.is_active:
        return next_call("llm_job_wait", f"the job is {row.status}; wait until it is done",
                         job_id=row.id)
    if row.status == JobStatus.COMPLETED:
        return next_call("llm_job_result", "the job completed; read its answer", job_id=row.id)
    return None


def reuse_of(row: JobRow, deduplicated: bool,
             now: datetime | None = None) -> dict[str, Any] | None:
    """How an existing job answered this request, or None when it ran afresh.

    Joining a queued or running identical job is the same work, shared. Handing back a
    *completed* job's answer is a replay: no work was done for this call, and a caller that
    asked again (an agent told to "run the tests and fix what fails") must be told so.
    """
    if not deduplicated:
        return None
    if row.status.is_active:
        return {"kind": "joined", "job_id": row.id, "status": str(row.status),
                "notice": f"An identical request was already {row.status} as job {row.id}: "
                          f"this call joined it (one run, shared). force_refresh=true starts "
                          f"a separate run."}
    finished = row.finished_at
    ago = None
    if finished is not None:
        ago = max(0.0, round(((now or datetime.now(UTC)) - finished).total_seconds(), 1))
    when = f"{ago:g} s ago" if ago is not None else "earlier"
    return {"kind": "replay", "job_id": row.id, "status": str(row.status),
            "finished_at": iso(finished), "finished_s_ago": ago,
            "notice": f"REPLAYED ANSWER, not a new run: job {row.id} got an identical request "
                      f"and finished {when}; nothing was run for this call. Call again with "
                      f"force_refresh=true to run it again."}


def _jsonable(value: Any) -> Any:
    """Datetimes to ISO text, enums to their values: structuredContent is plain JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, JobStatus | ErrorKind):
        return str(value)
    return value
