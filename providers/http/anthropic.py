"""The Anthropic Messages wire format: `POST {base_url}/v1/messages`.

`base_url` is the API root (`https://api.anthropic.com`); a root that already ends in `/v1`
is accepted too. Authentication is the `x-api-key` header plus a pinned `anthropic-version`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from httpx2 import ServerSentEvent

from providers.figures import Usage
from providers.http.wire import (
    RETRYABLE_STREAM_ERRORS,
    AnswerSummary,
    StreamFailure,
    error_detail,
    error_type,
)

ANTHROPIC_VERSION = "2023-06-01"  # the stable Messages API version; config headers may override
# The API requires max_tokens on every request; 4096 is accepted by every Claude model.
DEFAULT_MAX_TOKENS = 4096
MAX_TEMPERATURE = 1.0  # Anthropic's range is 0..1 (OpenAI's is 0..2)


def endpoint(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root + ("/messages" if root.endswith("/v1") else "/v1/messages")


def auth_headers(api_key: str | None) -> dict[str, str]:
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def build_body(normalized: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a streamed Messages request for a normalized request."""
    body: dict[str, Any] = {
        "model": normalized["model"],
        "messages": list(normalized["messages"]),
        "max_tokens": normalized.get("max_output_tokens") or DEFAULT_MAX_TOKENS,
        "stream": True,
    }
    if normalized.get("system"):
        body["system"] = normalized["system"]
    if normalized.get("temperature") is not None:
        body["temperature"] = normalized["temperature"]
    return body


def _merge_usage(usage: Usage, raw: Any) -> None:
    """Fold a `usage` object in, each figure checked: later events carry cumulative counts,
    so the last value wins."""
    if not isinstance(raw, Mapping):
        return
    for ours, theirs in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                         ("cache_read_tokens", "cache_read_input_tokens"),
                         ("cache_creation_tokens", "cache_creation_input_tokens")):
        usage.read(ours, raw.get(theirs))


class StreamParser:
    """Reads `message_start`, `content_block_delta` (text_delta), `message_delta` (stop
    reason, final output tokens), `message_stop` and `error`; ignores ping and thinking."""

    def __init__(self) -> None:
        self.summary = AnswerSummary()

    def feed(self, event: ServerSentEvent) -> str:
        if not event.data.strip():
            return ""
        data = json.loads(event.data)
        if not isinstance(data, Mapping):
            raise ValueError("a stream event is not a JSON object")
        kind = data.get("type") or event.event
        if kind == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
                text = delta.get("text")
                return text if isinstance(text, str) else ""
        elif kind == "message_start":
            message = data.get("message")
            if isinstance(message, Mapping):
                if isinstance(message.get("model"), str):
                    self.summary.model = message["model"]
                if isinstance(message.get("id"), str):
                    self.summary.response_id = message["id"]
                _merge_usage(self.summary.usage, message.get("usage"))
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, Mapping) and delta.get("stop_reason"):
                self.summary.stop_reason = str(delta["stop_reason"])
            _merge_usage(self.summary.usage, data.get("usage"))
        elif kind == "message_stop":
            self.summary.ended = True
        elif kind == "error":
            raise StreamFailure(error_detail(data) or "error event in the stream",
                                retryable=error_type(data) in RETRYABLE_STREAM_ERRORS)
        return ""


def new_stream_parser() -> StreamParser:
    return StreamParser()


def parse_answer(body: Any) -> tuple[str, AnswerSummary]:
    """Text and summary of a non-streamed `message` (a server that ignored stream)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("content"), list):
        raise ValueError("the answer has no `content` list")
    summary = AnswerSummary(ended=True)
    if isinstance(body.get("model"), str):
        summary.model = body["model"]
    if isinstance(body.get("id"), str):
        summary.response_id = body["id"]
    if body.get("stop_reason"):
        summary.stop_reason = str(body["stop_reason"])
    _merge_usage(summary.usage, body.get("usage"))
    text = "".join(block.get("text", "") for block in body["content"]
                   if isinstance(block, Mapping) and block.get("type") == "text")
    return text, summary
