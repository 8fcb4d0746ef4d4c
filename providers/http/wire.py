"""What the two HTTP wire formats (OpenAI chat completions, Anthropic Messages) share.

`providers/http/openai.py` and `providers/http/anthropic.py` each implement `WireFormat`
(module-level functions plus a `StreamParser` class); `gateway/jobs/http_call.py` drives them
and owns everything else (keys, retries, timeouts, errors). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from httpx2 import ServerSentEvent

from providers.figures import Usage


@dataclass(slots=True)
class AnswerSummary:
    """Everything about an answer except its text, filled in as events arrive."""

    model: str | None = None
    response_id: str | None = None
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    ended: bool = False  # the stream's own end marker arrived ([DONE] / message_stop)

    @property
    def complete(self) -> bool:
        """True once the API said the answer is over (a stop reason or the end marker)."""
        return self.ended or self.stop_reason is not None


class StreamFailure(Exception):
    """The API reported an error inside a 200 stream.

    `retryable` is True for overload and rate-limit errors, which a fresh attempt may cure.
    """

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class StreamParser(Protocol):
    summary: AnswerSummary

    def feed(self, event: ServerSentEvent) -> str:
        """Take one SSE event; return the text it adds ("" if none).

        Raises StreamFailure for an error event and ValueError for an unreadable one.
        """
        ...


class WireFormat(Protocol):
    """The per-kind half of an HTTP provider (a module satisfies it)."""

    def endpoint(self, base_url: str) -> str: ...

    def auth_headers(self, api_key: str | None) -> dict[str, str]: ...

    def build_body(self, normalized: Mapping[str, Any]) -> dict[str, Any]: ...

    def new_stream_parser(self) -> StreamParser: ...

    def parse_answer(self, body: Any) -> tuple[str, AnswerSummary]: ...


# Error types an API reports inside a stream that a new attempt may cure.
RETRYABLE_STREAM_ERRORS = frozenset({
    "overloaded_error", "rate_limit_error", "api_error", "server_error", "rate_limit_exceeded",
})


def error_detail(body: Any) -> str | None:
    """The human part of an API error body, for both shapes:

    OpenAI `{"error": {"message", "type", "code"}}`, Anthropic `{"type": "error", "error":
    {"type", "message"}}`. None when the body is not one of them.
    """
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    if isinstance(error, str):
        return error
    if not isinstance(error, Mapping):
        return None
    message = error.get("message")
    kind = error.get("type") or error.get("code")
    if message and kind:
        return f"{kind}: {message}"
    return str(message or kind) if (message or kind) else None


def error_type(body: Any) -> str | None:
    """The machine type of an API error body (`overloaded_error`, `server_error`...)."""
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        kind = body["error"].get("type") or body["error"].get("code")
        return str(kind) if kind else None
    return None
