"""The OpenAI-compatible wire format: `POST {base_url}/chat/completions`.

Works for OpenAI itself and for the many servers that copy its API (Ollama, vLLM, LM Studio,
OpenRouter, Groq, LiteLLM...). `base_url` is the part before `/chat/completions`, usually
ending in `/v1` (`https://api.openai.com/v1`, `http://localhost:11434/v1`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from httpx2 import ServerSentEvent

from providers.figures import Usage
from providers.http.wire import (
    RETRYABLE_STREAM_ERRORS,
    AnswerSummary,
    StreamFailure,
    error_detail,
    error_type,
)

# api.openai.com rejects `max_tokens` for its reasoning models and wants
# `max_completion_tokens`; most compatible servers only know `max_tokens`.
OPENAI_HOSTS_WITH_MAX_COMPLETION_TOKENS = frozenset({"api.openai.com"})


def endpoint(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def build_body(normalized: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a streamed chat completion for a normalized request."""
    messages: list[dict[str, str]] = []
    if normalized.get("system"):
        messages.append({"role": "system", "content": normalized["system"]})
    messages.extend(normalized["messages"])
    body: dict[str, Any] = {
        "model": normalized["model"],
        "messages": messages,
        "stream": True,
        # Without this the stream carries no token counts at all.
        "stream_options": {"include_usage": True},
    }
    if normalized.get("temperature") is not None:
        body["temperature"] = normalized["temperature"]
    if normalized.get("max_output_tokens") is not None:
        host = urlsplit(normalized["base_url"]).hostname or ""
        name = ("max_completion_tokens" if host in OPENAI_HOSTS_WITH_MAX_COMPLETION_TOKENS
                else "max_tokens")
        body[name] = normalized["max_output_tokens"]
    return body


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    usage = Usage()
    usage.read("input_tokens", raw.get("prompt_tokens"))
    usage.read("output_tokens", raw.get("completion_tokens"))
    details = raw.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        usage.read("cache_read_tokens", details.get("cached_tokens"))
    # OpenAI reports 0 cached tokens for every request that used no cache: no figure.
    usage.cache_read_tokens = usage.cache_read_tokens or None
    return usage


def _note_envelope(summary: AnswerSummary, chunk: Mapping[str, Any]) -> None:
    if isinstance(chunk.get("model"), str):
        summary.model = chunk["model"]
    if isinstance(chunk.get("id"), str):
        summary.response_id = chunk["id"]
    usage = _usage(chunk.get("usage"))
    if usage is not None:
        summary.usage = usage


class StreamParser:
    """Reads `data: {chat.completion.chunk}` events up to `data: [DONE]`.

    Text is choice 0's `delta.content`; `finish_reason` arrives on a late chunk and the usage
    on the very last one (an empty `choices` list), as `stream_options.include_usage` asks.
    """

    def __init__(self) -> None:
        self.summary = AnswerSummary()

    def feed(self, event: ServerSentEvent) -> str:
        data = event.data.strip()
        if not data:
            return ""
        if data == "[DONE]":
            self.summary.ended = True
            return ""
        chunk = json.loads(data)
        if not isinstance(chunk, Mapping):
            raise ValueError("a stream event is not a JSON object")
        if "error" in chunk:
            kind = error_type(chunk)
            raise StreamFailure(error_detail(chunk) or "error event in the stream",
                                retryable=kind in RETRYABLE_STREAM_ERRORS)
        _note_envelope(self.summary, chunk)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.summary.stop_reason = str(choice["finish_reason"])
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, Mapping) else None
        return text if isinstance(text, str) else ""


def new_stream_parser() -> StreamParser:
    return StreamParser()


def parse_answer(body: Any) -> tuple[str, AnswerSummary]:
    """Text and summary of a non-streamed `chat.completion` (a server that ignored stream)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list):
        raise ValueError("the answer has no `choices` list")
    summary = AnswerSummary(ended=True)
    _note_envelope(summary, body)
    text = ""
    if body["choices"] and isinstance(body["choices"][0], Mapping):
        choice = body["choices"][0]
        message = choice.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        text = content if isinstance(content, str) else ""
        if choice.get("finish_reason"):
            summary.stop_reason = str(choice["finish_reason"])
    return text, summary
