"""Where a job may run (issue 42): the `runs_on` request field, and whether a host's
published capabilities meet it.

`runs_on` is "here" (the admitting gateway's host: today's behaviour and the default),
"any" (any live worker that can run the provider) or a selector: {"host": NAME},
{"labels": {KEY: VALUE, ...}} and/or {"repo": NAME} (a worktree job's repository: a name in
the worker's [worker] repos or an origin URL), every key of which must be met. Stored on the job row as
canonical JSON (NULL for "here"); the PostgreSQL claim judges it in SQL at claim time
(store/postgres/workers.py), this module judges the same rule in Python for the owner's
`unschedulable_reason` and for which tools a gateway lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.model import Completion, ErrorKind, GatewayError, InstanceRow, JobRow, JobStatus

HERE = "here"
ANY = "any"
SELECTOR_KEYS = frozenset({"host", "labels", "repo"})
MAX_SELECTOR_CHARS = 1024  # a selector is a few names; a larger one is a mistake
CANCELLED_BEFORE_CLAIM = Completion(status=JobStatus.CANCELLED, error_kind=ErrorKind.CANCELLED,
                                    error="Cancelled before a worker took it.")


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def stored_runs_on(value: Any) -> str | None:
    """The row's `runs_on` for a caller's value: None for "here" (or no value), else its
    canonical JSON. Raises GatewayError(invalid_input) saying what is accepted."""
    if value is None or value == HERE:
        return None
    if value == ANY:
        return json.dumps(ANY)
    if not isinstance(value, dict) or not value or set(value) - SELECTOR_KEYS:
        raise _invalid('runs_on must be "here", "any", or a selector of {"host": NAME}, '
                       '{"labels": {KEY: VALUE}} and {"repo": NAME} (a worktree job\'s '
                       'repository; keys may be given together).')
    repo = value.get("repo")
    if "repo" in value and (not isinstance(repo, str) or not repo):
        raise _invalid("runs_on.repo must be a non-empty name of the worker's [worker] repos "
                       "or an origin URL.")
    host = value.get("host")
    if "host" in value and (not isinstance(host, str) or not host):
        raise _invalid("runs_on.host must be a non-empty hostname.")
    labels = value.get("labels")
    if "labels" in value and (not isinstance(labels, dict) or not labels or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        raise _invalid("runs_on.labels must be a non-empty object of string keys and "
                       "string values, e.g. {\"gpu\": \"true\"}.")
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SELECTOR_CHARS:
        raise _invalid(f"runs_on is over {MAX_SELECTOR_CHARS} characters; name a host or a "
                       f"few labels.")
    return text


def with_repo(runs_on: str, repo: str) -> str:
    """A worktree job's runs_on, with the repository its host must hold: {"repo": ...}
    joins the selector ("any" becomes {"repo": ...}), which the claim matches against the
    names and origin URLs of the worker's [worker] repos."""
    selector = json.loads(runs_on)
    merged = {"repo": repo} if selector == ANY else {**selector, "repo": repo}
    return json.dumps(merged, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def waiting_remote(row: JobRow) -> bool:
    """A job for another host that no worker has claimed yet (its admitter owns it)."""
    return (row.runs_on is not None and row.claimed_at is None
            and row.status is JobStatus.QUEUED)


@dataclass(frozen=True, slots=True)
class HostCapabilities:
    """What one live host published (InstanceRow.capabilities)."""

    hostname: str
    providers: frozenset[str]  # found and not known to be logged out
    labels: Mapping[str, str] = field(default_factory=dict)
    accept_remote: bool = False
    repos: frozenset[str] = frozenset()  # [worker] repos names and their origin URLs

    @classmethod
    def of(cls, row: InstanceRow) -> HostCapabilities | None:
        """The capabilities on an instance row, None when it published none (a gateway
        that is no worker) or they cannot be read."""
        try:
            data = json.loads(row.capabilities) if row.capabilities else None
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        providers = data.get("providers") or {}
        usable = frozenset(name for name, facts in providers.items()
                           if isinstance(facts, dict) and facts.get("logged_in") != "no")
        labels = data.get("labels") or {}
        return cls(hostname=str(data.get("hostname") or row.hostname), providers=usable,
                   labels={str(k): str(v) for k, v in labels.items()},
                   accept_remote=bool(data.get("accept_remote")),
                   repos=frozenset(repo_names(data)))


def meets(host: HostCapabilities, provider: str, runs_on: str) -> bool:
    """Whether `host` may take a job of `provider` stored with `runs_on` (the claim's rule)."""
    if not host.accept_remote or provider not in host.providers:
        return False
    selector = json.loads(runs_on)
    if selector == ANY:
        return True
    if not isinstance(selector, dict):
        return False
    if "host" in selector and selector["host"] != host.hostname:
        return False
    if "repo" in selector and selector["repo"] not in host.repos:
        return False
    wanted = selector.get("labels") or {}
    return all(host.labels.get(key) == value for key, value in wanted.items())


def unschedulable_reason(provider: str, runs_on: str,
                         hosts: Iterable[HostCapabilities]) -> str | None:
    """Why no live host meets the job now (None: one does), fit to show a caller."""
    hosts = list(hosts)
    if any(meets(host, provider, runs_on) for host in hosts):
        return None
    selector = json.loads(runs_on)
    wanted = "" if selector == ANY else f" matching runs_on {runs_on}"
    with_provider = [h for h in hosts if h.accept_remote and provider in h.providers]
    if not with_provider:
        return f"no live worker has {provider} installed and logged in"
    return f"no live worker with {provider}{wanted}"


def repo_names(capabilities: Mapping[str, Any]) -> list[str]:
    """What a worktree job's `repo` may name on a host: its [worker] repos names and their
    checkouts' origin URLs, as it published them."""
    names = [str(name) for name in capabilities.get("repos") or []]
    origins = capabilities.get("origins") or {}
    return sorted({*names, *(str(url) for url in origins.values() if url)})


def live_hosts(instances: Iterable[InstanceRow], now: float) -> list[HostCapabilities]:
    """The capabilities of the instances alive now (not stopped, lease not lapsed)."""
    hosts = []
    for row in instances:
        if row.stopped_at is not None or row.lease_expires_at is None:
            continue
        if row.lease_expires_at.timestamp() < now:
            continue
        caps = HostCapabilities.of(row)
        if caps is not None:
            hosts.append(caps)
    return hosts
