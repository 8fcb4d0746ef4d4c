"""Readers for the Claude-style event stream that Claude Code and Cursor Agent both print.

Both CLIs end a `json` run with one `{"type":"result", ...}` object and a `stream-json` run
with NDJSON events (`system` init, `assistant` messages, `result` last). Cursor reports
usage in camelCase, Claude in snake_case; both are read here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from providers.base import ProviderResult
from providers.common import stdout_answer
from providers.figures import Usage
from providers.parsing import Stdout, as_str

STREAM_EVENT_TYPES = frozenset({"system", "assistant", "user", "result", "stream_event",
                                "tool_call", "thinking"})


# Our figure -> its names in a Claude (snake_case) or Cursor (camelCase) usage object.
USAGE_KEYS: dict[str, tuple[str, ...]] = {
    "input_tokens": ("input_tokens", "inputTokens"),
    "output_tokens": ("output_tokens", "outputTokens"),
    "cache_read_tokens": ("cache_read_input_tokens", "cacheReadInputTokens", "cacheReadTokens"),
    "cache_creation_tokens": ("cache_creation_input_tokens", "cacheCreationInputTokens",
                              "cacheWriteTokens"),
}


def usage_from(raw: Any, cost: Any = None) -> Usage | None:
    """Usage from a Claude (snake_case) or Cursor (camelCase) usage object, every figure
    checked (providers/figures.py); None if it reports none."""
    usage = Usage()
    usage.read("cost_usd", cost)
    if isinstance(raw, Mapping):
        for name, keys in USAGE_KEYS.items():
            usage.read_first(name, raw, *keys)
    return usage.found()


# claude's `apiKeySource` in its `system/init` event: "none" is a claude.ai login (a Pro or
# Max subscription), any key source is API billing.
SUBSCRIPTION_KEY_SOURCE = "none"


def billing_of(init: Mapping[str, Any]) -> str | None:
    """"subscription" | "api" from a claude init event; None when it does not say."""
    source = as_str(init.get("apiKeySource"))
    if source is None:
        return None
    return "subscription" if source == SUBSCRIPTION_KEY_SOURCE else "api"


def models_from(raw: Any, usage: Usage) -> None:
    """claude's per-model `modelUsage` into `usage.models`, as usage objects of our names
    (figures it reported only, each checked: a refused one is noted in `usage.refused` as
    `models.<name>.<figure>`)."""
    if not isinstance(raw, Mapping):
        return
    models: dict[str, dict[str, Any]] = {}
    for name, figures in raw.items():
        one = usage_from(figures, figures.get("costUSD") if isinstance(figures, Mapping)
                         else None)
        if one is None:
            continue
        for figure, why in one.refused.items():
            usage.refused[f"models.{name}.{figure}"] = why
        if one.as_dict():
            models[str(name)] = one.as_dict()
    usage.models = models or None


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


class ClaudeStyleRun:
    """What a Claude-style run printed, read one event at a time.

    Keeps only what its result needs (the ids, the model, the last `result` event and the
    assistant's text), never the events: a stream-json run can be max_output_bytes of
    partial messages and tool output.
    """

    def __init__(self) -> None:
        self.events = 0  # JSON objects seen, of any type
        self.streamed = False  # one of them was a Claude-style event
        self.session_id: str | None = None
        self.model: str | None = None  # from the first `system` event that names one
        self.result: Mapping[str, Any] | None = None  # the last `result` event
        self.billing: str | None = None  # from the init event's apiKeySource
        self.messages: list[str] = []  # whole assistant messages
        self.deltas: list[str] = []  # streamed text deltas, while there is no whole message

    @classmethod
    def read(cls, events: Iterable[Mapping[str, Any]]) -> ClaudeStyleRun:
        run = cls()
        for event in events:
            run.add(event)
        return run

    def add(self, event: Mapping[str, Any]) -> None:
        self.events += 1
        kind = event.get("type")
        self.streamed = self.streamed or kind in STREAM_EVENT_TYPES
        self.session_id = (as_str(event.get("session_id")) or as_str(event.get("sessionId"))
                           or self.session_id)
        if kind == "result":
            self.result = event
        elif kind == "system":
            self.billing = billing_of(event) or self.billing
            if self.model is None and as_str(event.get("model")):
                self.model = str(event["model"])
        elif kind == "assistant" and (text := _message_text(event)):
            self.messages.append(text)
            self.deltas.clear()  # whole messages are the answer: the deltas are not needed
        elif kind == "stream_event" and not self.messages:
            inner = event.get("event")
            delta = inner.get("delta") if isinstance(inner, Mapping) else None
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
                self.deltas.append(as_str(delta.get("text")) or "")

    def assistant_text(self) -> str:
        """What the assistant said: whole messages, else the streamed text deltas."""
        return "\n\n".join(self.messages) if self.messages else "".join(self.deltas)

    def outcome(self, exit_code: int | None) -> ProviderResult | None:
        """The ProviderResult, or None when the events were not a Claude-style run.

        Uses the last `result` event; without one (a run killed mid-stream) returns what the
        assistant had said so far, marked as an error with `extra["incomplete"] = True`.
        """
        if not self.streamed:
            return None
        result = self.result
        model = self.model
        if result is None:
            return ProviderResult(
                text=self.assistant_text(), session_id=self.session_id, is_error=True,
                extra={"incomplete": True, **({"model": model} if model else {})},
            )
        subtype = as_str(result.get("subtype"))
        failed_exit = exit_code is not None and exit_code != 0
        is_error = bool(result.get("is_error")) or (subtype not in (None, "success")) or failed_exit
        text = result.get("result")
        if not isinstance(text, str):
            text = self.assistant_text()
        if not text and is_error:
            text = _error_text(result)
        extra: dict[str, Any] = {}
        for key in ("num_turns", "stop_reason", "duration_ms", "duration_api_ms", "subtype"):
            if result.get(key) is not None:
                extra[key] = result[key]
        model_usage = result.get("modelUsage")
        if model is None and isinstance(model_usage, Mapping) and model_usage:
            model = str(next(iter(model_usage)))
        if model:
            extra["model"] = model
        usage = usage_from(result.get("usage"), result.get("total_cost_usd"))
        if usage is not None:
            usage.billing = self.billing
            models_from(model_usage, usage)
        return ProviderResult(
            text=text, session_id=as_str(result.get("session_id")) or self.session_id,
            usage=usage, is_error=is_error, extra=extra,
        )


def _error_text(result: Mapping[str, Any]) -> str:
    errors = result.get("errors")
    if isinstance(errors, Sequence) and not isinstance(errors, str):
        joined = "; ".join(str(e) for e in errors if e)
        if joined:
            return joined
    return as_str(result.get("error")) or f"the CLI ended with {result.get('subtype', 'an error')}"


def claude_style_result(events: Iterable[Mapping[str, Any]],
                        exit_code: int | None) -> ProviderResult | None:
    """The ProviderResult of a Claude-style run, or None when `events` are not such a run
    (see ClaudeStyleRun.outcome)."""
    return ClaudeStyleRun.read(events).outcome(exit_code)


def parse_claude_style(stdout: Stdout, exit_code: int | None) -> ProviderResult:
    """A Claude-style run's result: from its NDJSON events (`stream-json`), else from its one
    result object (`json`), else its stdout is the plain-text answer (`text`)."""
    run = ClaudeStyleRun.read(stdout.json_objects())
    if not run.events:
        document = stdout.json_document()
        if isinstance(document, dict):
            run = ClaudeStyleRun.read([document])
    return run.outcome(exit_code) or stdout_answer(exit_code)


def has_auth_error_event(events: Iterable[Mapping[str, Any]], pattern: re.Pattern[str]) -> bool:
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
