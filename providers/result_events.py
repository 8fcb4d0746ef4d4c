"""Readers for the Claude-style event stream that Claude Code and Cursor Agent both print.

Both CLIs end a `json` run with one `{"type":"result", ...}` object and a `stream-json` run
with NDJSON events (`system` init, `assistant` messages, `result` last). Cursor reports
usage in camelCase, Claude in snake_case; both are read here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import ProviderResult, Usage
from providers.parsing import as_float, as_int, as_str

STREAM_EVENT_TYPES = frozenset({"system", "assistant", "user", "result", "stream_event",
                                "tool_call", "thinking"})


def _first_int(data: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = as_int(data.get(name))
        if value is not None:
            return value
    return None


def usage_from(raw: Any, cost: Any = None) -> Usage | None:
    """Usage from a Claude (snake_case) or Cursor (camelCase) usage object; None if absent."""
    usage = Usage(cost_usd=as_float(cost))
    if isinstance(raw, Mapping):
        usage.input_tokens = _first_int(raw, "input_tokens", "inputTokens")
        usage.output_tokens = _first_int(raw, "output_tokens", "outputTokens")
        usage.cache_read_tokens = _first_int(
            raw, "cache_read_input_tokens", "cacheReadInputTokens", "cacheReadTokens")
        usage.cache_creation_tokens = _first_int(
            raw, "cache_creation_input_tokens", "cacheCreationInputTokens", "cacheWriteTokens")
    return usage if usage.as_dict() else None


def _message_text(event: Mapping[str, Any]) -> str:
    message = event.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, Sequence):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                text = as_str(block.get("text"))
                if text:
                    parts.append(text)
    return "".join(parts)


def _assistant_text(events: Sequence[Mapping[str, Any]]) -> str:
    """What the assistant said so far: whole messages, else the streamed text deltas."""
    messages = [t for e in events if e.get("type") == "assistant" and (t := _message_text(e))]
    if messages:
        return "\n\n".join(messages)
    deltas: list[str] = []
    for event in events:
        inner = event.get("event")
        if event.get("type") == "stream_event" and isinstance(inner, Mapping):
            delta = inner.get("delta")
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
                deltas.append(as_str(delta.get("text")) or "")
    return "".join(deltas)


def _model(events: Sequence[Mapping[str, Any]], result: Mapping[str, Any] | None) -> str | None:
    for event in events:
        if event.get("type") == "system" and as_str(event.get("model")):
            return str(event["model"])
    model_usage = result.get("modelUsage") if result else None
    if isinstance(model_usage, Mapping) and model_usage:
        return str(next(iter(model_usage)))
    return None


def _error_text(result: Mapping[str, Any]) -> str:
    errors = result.get("errors")
    if isinstance(errors, Sequence) and not isinstance(errors, str):
        joined = "; ".join(str(e) for e in errors if e)
        if joined:
            return joined
    return as_str(result.get("error")) or f"the CLI ended with {result.get('subtype', 'an error')}"


def claude_style_result(events: Sequence[Mapping[str, Any]],
                        exit_code: int | None) -> ProviderResult | None:
    """The ProviderResult of a Claude-style run, or None when `events` are not such a run.

    Uses the last `result` event; without one (a run killed mid-stream) returns what the
    assistant had said so far, marked as an error with `extra["incomplete"] = True`.
    """
    if not any(e.get("type") in STREAM_EVENT_TYPES for e in events):
        return None
    session_id: str | None = None
    for event in events:
        session_id = as_str(event.get("session_id")) or as_str(event.get("sessionId")) or session_id
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    failed_exit = exit_code is not None and exit_code != 0
    if result is None:
        return ProviderResult(
            text=_assistant_text(events), session_id=session_id, is_error=True,
            extra={"incomplete": True, **({"model": m} if (m := _model(events, None)) else {})},
        )
    subtype = as_str(result.get("subtype"))
    is_error = bool(result.get("is_error")) or (subtype not in (None, "success")) or failed_exit
    text = result.get("result")
    if not isinstance(text, str):
        text = _assistant_text(events)
    if not text and is_error:
        text = _error_text(result)
    extra: dict[str, Any] = {}
    for key in ("num_turns", "stop_reason", "duration_ms", "duration_api_ms", "subtype"):
        if result.get(key) is not None:
            extra[key] = result[key]
    model = _model(events, result)
    if model:
        extra["model"] = model
    return ProviderResult(
        text=text, session_id=as_str(result.get("session_id")) or session_id,
        usage=usage_from(result.get("usage"), result.get("total_cost_usd")),
        is_error=is_error, extra=extra,
    )


def has_auth_error_event(events: Sequence[Mapping[str, Any]], pattern: re.Pattern[str]) -> bool:
    """True when an error result (or an API-error assistant message) says "not logged in"."""
    for event in events:
        if event.get("error") == "authentication_failed":
            return True
        if event.get("type") == "result" and event.get("is_error"):
            text = as_str(event.get("result")) or _error_text(event)
            if pattern.search(text):
                return True
        if (event.get("type") == "assistant" and event.get("is_api_error_message")
                and pattern.search(_message_text(event))):
            return True
    return False
