"""`ExecutionOutcome` -> the store's `Completion`: how a finished run becomes its job's
terminal write (one rule for owner and adopter, both transports). The step before it, for a
process run, is gateway/jobs/run/record_to_outcome.py (supervisor end record -> outcome)."""

from __future__ import annotations

import json
from typing import Any

from gateway.jobs.execution import ExecutionOutcome
from gateway.jobs.requests import canonical_json
from gateway.model import Completion, ErrorKind, JobStatus, UsageFigures
from providers.figures import plain_json
from providers.usage import has_figures, usage_record


def completion_of(outcome: ExecutionOutcome, login_hint: str,
                  model: str | None = None,
                  worktree: dict[str, Any] | None = None) -> Completion:
    """The terminal write a finished run asks for: its status and error kind from how it
    ended (and what the provider said), and the answer stored once, as a range of the
    output when it is one. `login_hint` becomes the error of a run the CLI refused as not
    logged in. `model` is what the job asked for: the one an estimate prices when the CLI
    did not name the model it ran. `worktree`: an isolated run's settled worktree (the
    drive's report of it, worktrees/finish.py), stored beside the answer."""
    result = outcome.result
    kind = outcome.error_kind
    error = outcome.error
    status = JobStatus.COMPLETED
    if kind == ErrorKind.CANCELLED:
        status = JobStatus.CANCELLED
    elif kind in (ErrorKind.TIMEOUT, ErrorKind.IDLE_TIMEOUT):
        status = JobStatus.TIMED_OUT
    elif kind is not None:
        status = JobStatus.FAILED
    elif result is not None and result.is_error:
        status, kind = JobStatus.FAILED, ErrorKind.PROVIDER_ERROR
        error = error or (result.text[:500] if result.text else "the provider reported an error")
    if outcome.auth_error and status == JobStatus.FAILED:
        kind = ErrorKind.AUTH
        error = f"{login_hint} ({error})" if error else login_hint
    result_json = None
    usage: UsageFigures | None = None
    if result is not None:
        ran = result.extra.get("model")
        ran_model = ran if isinstance(ran, str) and ran else model
        record = usage_record(result.usage, ran_model)
        usage = usage_figures(record, ran_model)
        # An answer that is (a range of) the output is stored as that range, not as a
        # second copy: read_output resolves `text_span` against `output`.
        answer: dict[str, Any] = ({"text": result.text} if outcome.answer_span is None
                                  else {"text_span": list(outcome.answer_span)})
        result_json = canonical_json({
            **answer, "session_id": result.session_id,
            "usage": record,
            "is_error": result.is_error, "extra": plain_json(result.extra),
            "duration_s": round(outcome.duration_s, 3),
        })
    if worktree is not None:  # an isolated run: its worktree beside the answer
        parsed = json.loads(result_json) if result_json else {}
        result_json = canonical_json({**parsed, "worktree": worktree})
    return Completion(status=status, exit_code=outcome.exit_code, error=error,
                      error_kind=kind, output=outcome.output, stderr_tail=outcome.stderr_tail,
                      output_bytes=outcome.output_bytes, truncated=outcome.truncated,
                      result_json=result_json, usage=usage,
                      ended_at=outcome.ended_at)


def usage_figures(record: dict[str, Any], model: str | None) -> UsageFigures | None:
    """The totals' share of a stored usage object; None when it holds no figure at all and
    no invalid cost either (a job whose only figures were refused is counted as `invalid`,
    and settles its budget as one: gateway/store/usage.py `spent_on`)."""
    if not has_figures(record) and record.get("cost_source") != "invalid":
        return None
    return UsageFigures(
        cost_source=str(record.get("cost_source", "absent")), model=model,
        input_tokens=record.get("input_tokens"), output_tokens=record.get("output_tokens"),
        cache_read_tokens=record.get("cache_read_tokens"),
        cache_creation_tokens=record.get("cache_creation_tokens"),
        cost_usd=record.get("cost_usd"))
