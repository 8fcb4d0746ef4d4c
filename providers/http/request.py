"""The request of an HTTP model-API provider, and how it is described without secrets.

`ApiRequest` is the validated input of `<name>_request[_async]` (its field descriptions become
the MCP tool schema); `normalized_request` is the canonical dict stored as `request_json` and
hashed into the request key. Nothing here knows about jobs or stores: an unusable request
raises `InvalidRequest`, which the job layer turns into an `invalid_input` answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from neutral.loopback import is_loopback_host

# The secret rules live in neutral/redaction.py; these two are named here as well because
# the job layer reads them beside the request (gateway/jobs/http_call.py).
from neutral.redaction import REDACTED, is_secret_header
from neutral.redaction import redact_url as redact_url
from neutral.redaction import scrub as scrub
from providers.base import InvalidRequest
from providers.http import anthropic

# A bound on max_output_tokens: past any model's output window, so 2**70 is refused at the
# tool instead of sent to the API.
MAX_OUTPUT_TOKENS = 1_000_000


class ApiEndpoint(Protocol):
    """What `normalized_request` reads of an `[api_providers.<name>]` entry."""

    @property
    def kind(self) -> Literal["openai", "anthropic"]: ...
    @property
    def base_url(self) -> str: ...
    @property
    def default_model(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class ApiMessage(BaseModel):
    """One turn of a conversation."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"] = Field(
        description="Who said it: 'user' or 'assistant'. Put instructions in `system` instead.")
    content: str = Field(min_length=1, description="The text of this turn.")


class ApiRequest(BaseModel):
    """A request to an HTTP model API. HTTP APIs keep no session: to continue a
    conversation, send the whole of it in `messages`."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = Field(
        default=None, min_length=1,
        description="The message to send, as a single user turn. Give either `prompt` or "
                    "`messages`, not both.")
    messages: list[ApiMessage] | None = Field(
        default=None, min_length=1,
        description="The whole conversation so far, oldest turn first, usually ending with "
                    "the user's new turn. Use instead of `prompt` to continue a conversation.")
    model: str | None = Field(
        default=None, min_length=1,
        description="The model id as this API names it (e.g. 'gpt-4o-mini', "
                    "'claude-sonnet-4-5'). Omit to use the provider's configured default_model.")
    system: str | None = Field(
        default=None,
        description="System instructions that frame the whole conversation (role, rules, "
                    "output format). Omit for none.")
    temperature: float | None = Field(
        default=None, ge=0, le=2,
        description="Sampling temperature: 0 is most deterministic, higher is more varied. "
                    "0..2 for OpenAI-compatible APIs, 0..1 for Anthropic. Omit for the API's "
                    "default.")
    max_output_tokens: int | None = Field(
        default=None, ge=1, le=MAX_OUTPUT_TOKENS,
        description="Upper bound on the tokens the model may generate. Omit for the API's "
                    f"default (Anthropic requires one; {anthropic.DEFAULT_MAX_TOKENS} "
                    "is sent).")

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> ApiRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` (a single user message) or "
                             "`messages` (a whole conversation)")
        return self


# -- secrets ---------------------------------------------------------------------------


def is_loopback_url(url: str) -> bool:
    """True for a base_url on this machine (a local server such as Ollama may need no key)."""
    try:
        host = urlsplit(url).hostname  # lower case, IPv6 brackets removed
    except ValueError:
        return False
    return is_loopback_host(host or "")


def public_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Configured headers for the request key: secret-looking values replaced, names sorted."""
    return {name: (REDACTED if is_secret_header(name) else value)
            for name, value in sorted(headers.items(), key=lambda kv: kv[0].lower())}


# -- the request -----------------------------------------------------------------------


def normalized_request(name: str, config: ApiEndpoint, request: ApiRequest) -> dict[str, Any]:
    """The canonical, secret-free description of what `call_api` will send.

    Stored as the job's `request_json` and hashed into its request key, so it holds every
    input that changes the answer (endpoint, model, messages, sampling, non-secret headers)
    and nothing secret: no API key, no secret-looking header value or URL parameter.

    Raises InvalidRequest when no model is known or a value is out of the
    API's range.
    """
    model = request.model or config.default_model
    if not model:
        raise InvalidRequest(
            f"api provider '{name}' has no model to use: pass `model`, or set default_model "
            f"in [api_providers.{name}]")
    if (config.kind == "anthropic" and request.temperature is not None
            and request.temperature > anthropic.MAX_TEMPERATURE):
        raise InvalidRequest(
            f"temperature {request.temperature:g} is out of range for api provider '{name}' "
            f"(Anthropic accepts 0..{anthropic.MAX_TEMPERATURE:g})")
    if request.messages is not None:
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        messages = [{"role": "user", "content": request.prompt or ""}]
    max_output_tokens = request.max_output_tokens
    if max_output_tokens is None and config.kind == "anthropic":
        max_output_tokens = anthropic.DEFAULT_MAX_TOKENS
    return {
        "transport": "http",
        "provider": name,
        "kind": config.kind,
        "base_url": redact_url(config.base_url),
        "model": model,
        "system": request.system,
        "messages": messages,
        "temperature": request.temperature,
        "max_output_tokens": max_output_tokens,
        "headers": public_headers(config.headers),
    }


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `Retry-After` (seconds or an HTTP date).

    None when absent or unreadable; never negative.
    """
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            value = float(millis) / 1000
            if math.isfinite(value):
                return max(0.0, value)
        except ValueError:
            pass
    raw = (headers.get("retry-after") or "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


