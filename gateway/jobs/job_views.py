"""What a job's row says to a person, read the same way by every view of it (`jobs list`,
`jobs show`, the dashboard): the request as sent (secrets redacted again), its prompt, how
long it ran."""

from __future__ import annotations

import json
from typing import Any

from gateway.jobs.requests import stored_fields
from gateway.model import JobRow
from neutral.redaction import redact_value


def request_of(job: JobRow) -> dict[str, Any]:
    """The normalized request (already secret-free by construction; redacted again)."""
    redacted = redact_value(stored_fields(job.request_json))
    return redacted if isinstance(redacted, dict) else {}


def prompt_of(job: JobRow) -> str:
    """The prompt as sent: a CLI job's `prompt`, an API job's last user message."""
    request = request_of(job)
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def ran_for(job: JobRow, now: float) -> float | None:
    """Seconds the job has run: to its end, or to now while it runs."""
    if job.started_at is None:
        return None
    end = job.finished_at.timestamp() if job.finished_at else now
    return max(0.0, end - job.started_at.timestamp())
