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
    # A CLI job's isolation (issue #27): None takes [worktrees] default_isolation;
    # "worktree" runs it in a git worktree of its own made from base_ref (None: HEAD).
    isolation: str | None = None
    base_ref: str | None = None
    # The most this job may cost (USD): reserved against [budgets] and passed to a CLI that
    # can stop itself at it (claude, vibe). None: job_reservation_usd when a budget applies.
    max_cost_usd: float | None = None
    # Who asks (gateway/mcp/principal.py): recorded on the job, and part of its dedup key so
    # that an identical request of another principal never joins this one's job.
    principal: str | None = None
    # Where it runs (gateway/jobs/placement.py): None or "here", "any", or a selector dict.
    # Not part of the request key: the same work wherever it runs.
    runs_on: Any = None


def canonical_json(value: Any) -> str:
    """Stable JSON: sorted keys, no whitespace, UTF-8 kept (same request, same bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


# The key in request_json that keeps the caller's own timeout_s for a re-queued run. Not in
# the normalized request (so not in the request key: a longer timeout is the same work).
TIMEOUT_KEY = "timeout_s"


# The key in request_json of an isolated job's planned worktree (its path and branch are
# named after the job id the gateway minted, so it is not in the request key either).
WORKTREE_KEY = "worktree"


def stored_request(normalized: dict[str, Any], timeout_s: float | None,
                   worktree: dict[str, Any] | None = None) -> str:
    """The job's request_json: the normalized request, plus the caller's timeout_s (when it
    gave one), which is all a re-queue has to run the job again with, and an isolated job's
    worktree plan."""
    stored = dict(normalized)
    if timeout_s is not None:
        stored[TIMEOUT_KEY] = timeout_s
    if worktree is not None:
        stored[WORKTREE_KEY] = worktree
    return canonical_json(stored)


def with_worktree(request_json: str | None, worktree: dict[str, Any]) -> str:
    """A stored request with the worktree a worker planned for it at its claim (a remote
    job is planned where it runs, not where it was admitted)."""
    stored = stored_fields(request_json)
    stored[WORKTREE_KEY] = worktree
    return canonical_json(stored)


def stored_fields(request_json: str | None) -> dict[str, Any]:
    """The fields of a job's request_json, as `stored_request` wrote them: the one reader of
    a stored request (re-queue and adoption rebuild the request from it, the worktree plan
    and the CLI's job views read it). A row without one, or whose text is not a JSON object
    (a gateway never writes such a row), reads as no fields: each caller then finds what it
    looks for missing, as it would on a row from before that field existed."""
    if not request_json:
        return {}
    try:
        stored = json.loads(request_json)
    except ValueError:
        return {}
    return stored if isinstance(stored, dict) else {}


def request_key(normalized: dict[str, Any], principal: str | None = None) -> str:
    """sha256 of the canonical JSON of the normalized request (and of who asks).

    The normalized request never holds a secret nor an id the gateway minted itself, so two
    identical requests (even from two instances) get the same key; of two principals, two
    keys: an identical request never joins another principal's job.
    """
    keyed = normalized if principal is None else {**normalized, "principal": principal}
    return hashlib.sha256(canonical_json(keyed).encode("utf-8")).hexdigest()
