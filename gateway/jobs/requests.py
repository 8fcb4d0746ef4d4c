"""What a caller asks for, normalized, and the request key that dedup is built on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SubmitRequest:
    """One request to a provider, as the MCP tools and the CLI pass it to the manager.

    `options` are the provider's own options (validated by the provider's options model for
    CLI providers, by `ApiRequest` for HTTP API providers).
    """

    prompt: str | None = None
    model: str | None = None
    working_dir: str | None = None
    session_id: str | None = None
    timeout_s: float | None = None
    force_refresh: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    correlation_id: str | None = None


def canonical_json(value: Any) -> str:
    """Stable JSON: sorted keys, no whitespace, UTF-8 kept (same request, same bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def request_key(normalized: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the normalized request.

    The normalized request never holds a secret nor an id the gateway minted itself, so two
    identical requests (even from two instances) get the same key.
    """
    return hashlib.sha256(canonical_json(normalized).encode("utf-8")).hexdigest()
