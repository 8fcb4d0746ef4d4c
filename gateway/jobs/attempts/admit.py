"""Admitting an attempt group: N jobs, their worktrees and budget reservations, one decision.

Every attempt is an ordinary worktree job (the single-job path's validation, worktree plan,
limiter ticket and spool dir, manager.py), from the one `base_sha` the group's `base_ref`
resolved to; the store writes the group, its N rows and their N reservations in one
transaction (`insert_attempt_group`), so a refusal of any part (a budget, the queue, a bad
target) admits nothing. An identical call (same prompt, targets, base_sha, check, until,
judge, caller) joins the running group: the store's partial unique index decides a race.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.jobs.limiter import Ticket
from gateway.jobs.manager import JobManager
from gateway.jobs.reads import store_down
from gateway.jobs.requests import SubmitRequest, canonical_json, request_key, stored_request
from gateway.jobs.targets import CliLaunch, resolve_target
from gateway.jobs.worktrees.create import plan_for
from gateway.model import ErrorKind, GatewayError, NewJob
from gateway.store.attempts import (
    DEFAULT_CHECK_TIMEOUT_S,
    MAX_CHECK_TIMEOUT_S,
    AttemptGroupRow,
    DuplicateActiveGroup,
    NewAttemptGroup,
)
from gateway.store.base import StoreUnavailable

log = structlog.get_logger(__name__)

UNTIL = ("all", "first_passing")
ATTEMPT_KEY = "attempt"  # in an attempt job's normalized request: its group and ordinal


@dataclass(frozen=True, slots=True)
class AttemptTarget:
    provider: str
    model: str | None = None
    count: int = 1


@dataclass(slots=True)
class GroupRequest:
    prompt: str
    targets: Sequence[AttemptTarget]
    working_dir: str
    base_ref: str = "HEAD"
    check: Sequence[str] | None = None  # None: [attempts] check (may be empty: no check)
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    until: str = "all"
    judge: dict[str, Any] | None = None
    timeout_s: float | None = None
    max_cost_usd: float | None = None
    principal: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class GroupSubmission:
    group: AttemptGroupRow
    job_ids: list[str]
    joined: bool  # an identical running group was answered


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def validated_check(request: GroupRequest, default: Sequence[str]) -> list[str] | None:
    """The check's argv (None: no check); refused when it is not a list of strings."""
    argv = list(default) if request.check is None else list(request.check)
    if not argv:
        return None
    if not all(isinstance(arg, str) and arg for arg in argv):
        raise _invalid("check must be an argv list of non-empty strings, e.g. "
                       "[\"uv\", \"run\", \"pytest\", \"-q\"] (never a shell string).")
    return argv


def _validate(request: GroupRequest, max_attempts: int, check: list[str] | None) -> None:
    total = sum(target.count for target in request.targets)
    if any(target.count < 1 for target in request.targets):
        raise _invalid("each target's count must be at least 1.")
    if not 2 <= total <= max_attempts:
        raise _invalid(f"a group has 2 to {max_attempts} attempts in all ([attempts] "
                       f"max_attempts); these targets make {total}.")
    if request.until not in UNTIL:
        raise _invalid(f"until must be \"all\" or \"first_passing\"; got {request.until!r}.")
    if request.until == "first_passing" and check is None:
        raise _invalid("until = \"first_passing\" needs a check: pass check (an argv list) "
                       "or set [attempts] check.")
    if not 0 < request.check_timeout_s <= MAX_CHECK_TIMEOUT_S:
        raise _invalid(f"check_timeout_s must be above 0 and at most {MAX_CHECK_TIMEOUT_S}.")


def dedup_key(request: GroupRequest, base_sha: str, check: list[str] | None) -> str:
    """What makes two calls the same group: what they ask, from the same commit."""
    payload = canonical_json({
        "prompt": request.prompt, "working_dir": request.working_dir, "base_sha": base_sha,
        "targets": [[t.provider, t.model, t.count] for t in request.targets],
        "check": check, "check_timeout_s": request.check_timeout_s, "until": request.until,
        "judge": request.judge, "timeout_s": request.timeout_s,
        "max_cost_usd": request.max_cost_usd, "principal": request.principal,
        "options": request.options})
    return hashlib.sha256(payload.encode()).hexdigest()


def _attempt_request(request: GroupRequest, target: AttemptTarget, base: str) -> SubmitRequest:
    return SubmitRequest(prompt=request.prompt, model=target.model,
                         working_dir=request.working_dir, timeout_s=request.timeout_s,
                         isolation="worktree", base_ref=base, options=dict(request.options),
                         max_cost_usd=request.max_cost_usd, principal=request.principal)


def _expanded(targets: Sequence[AttemptTarget]) -> list[AttemptTarget]:
    return [target for target in targets for _ in range(target.count)]


async def submit_group(manager: JobManager, request: GroupRequest) -> GroupSubmission:
    """Admit the group (or answer the identical running one). Raises GatewayError:
    invalid_input, not_found, budget_exceeded, saturated, unavailable; nothing is admitted
    then. Shielded like manager.submit: a caller that gives up never leaves half a group."""
    task = asyncio.create_task(_admit(manager, request), name="admit-attempts")
    task.add_done_callback(_retrieve_exception)
    return await asyncio.shield(task)


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    """A shielded admission's outcome is seen even when its caller is gone."""
    if not task.cancelled():
        task.exception()


async def _admit(manager: JobManager, request: GroupRequest) -> GroupSubmission:
    settings = manager.settings
    check = validated_check(request, settings.attempts.check)
    _validate(request, settings.attempts.max_attempts, check)
    attempts = _expanded(request.targets)
    # The base is resolved once, by the first target's validation: every attempt then starts
    # from that commit, whatever the branch does meanwhile.
    first = resolve_target(settings, attempts[0].provider,
                           _attempt_request(request, attempts[0], request.base_ref))
    if not isinstance(first, CliLaunch) or first.repository is None:
        raise _invalid(f"provider {attempts[0].provider!r} cannot run an attempt: attempts "
                       f"are CLI jobs in worktrees of a git repository.")
    base_sha = first.repository.base_sha
    key = dedup_key(request, base_sha, check)
    joined = await _find(manager, key)
    if joined is not None:
        return joined
    for provider in {target.provider for target in attempts}:
        refusal = manager.admission.refusal(provider)
        if refusal is not None:
            raise refusal
    group_id = str(uuid.uuid4())
    launches: list[tuple[NewJob, CliLaunch, Ticket, SubmitRequest]] = []
    try:
        for ordinal, target in enumerate(attempts):
            launches.append(_plan_attempt(manager, request, target, base_sha, group_id,
                                          ordinal))
        new = NewAttemptGroup(
            group_id=group_id, dedup_key=key, prompt=request.prompt,
            targets=[{"provider": t.provider, "model": t.model, "count": t.count}
                     for t in request.targets],
            base_sha=base_sha, working_dir=request.working_dir, check_argv=check,
            check_timeout_s=request.check_timeout_s, until=request.until,
            judge=request.judge, principal=request.principal)
        row = await manager.store.insert_attempt_group(
            new, [job for job, *_ in launches], settings.lease.ttl_s)
    except DuplicateActiveGroup as dup:
        _release(manager, launches)
        found = await _find(manager, key)
        if found is None:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               f"An identical attempt group ({dup.existing_id}) was admitted "
                               f"at the same moment but could not be read back; retry.") from None
        return found
    except StoreUnavailable as exc:
        _release(manager, launches)
        raise store_down(exc) from None
    except BaseException:
        _release(manager, launches)
        raise
    for job, launch, ticket, submit in launches:
        stored = await manager.store.get_job(job.id, with_output=False)
        if stored is not None:
            manager.start_local(stored, launch, ticket, submit)
    log.info("attempt group admitted", action="admit_attempts", group_id=group_id,
             attempts=len(launches), base_sha=base_sha)
    return GroupSubmission(row, [job.id for job, *_ in launches], False)


def _plan_attempt(manager: JobManager, request: GroupRequest, target: AttemptTarget,
                  base_sha: str, group_id: str, ordinal: int,
                  ) -> tuple[NewJob, CliLaunch, Ticket, SubmitRequest]:
    """One attempt's job, as manager._admit builds a job: validated, its worktree planned,
    a limiter ticket held (SATURATED raises, holding nothing of this attempt)."""
    submit = _attempt_request(request, target, base_sha)
    launch = resolve_target(manager.settings, target.provider, submit)
    if not isinstance(launch, CliLaunch) or launch.repository is None:
        raise _invalid(f"provider {target.provider!r} cannot run an attempt: attempts are "
                       f"CLI jobs in worktrees of a git repository.")
    # Its place in the group: part of the job's request (and key), so N identical attempts
    # are N jobs, and an adopter knows the job is an attempt from its row alone.
    launch.normalized[ATTEMPT_KEY] = {"group_id": group_id, "ordinal": ordinal}
    job_id = str(uuid.uuid4())
    launch.worktree = plan_for(manager.settings, launch.repository, base_sha, job_id,
                               manager.instance_id)
    ticket = manager.limiter.acquire(target.provider)
    new = NewJob(
        id=job_id, provider=target.provider,
        request_key=request_key(launch.normalized, request.principal),
        owner_instance=manager.instance_id, transport=launch.transport,
        correlation_id=f"{group_id}:{ordinal}", hostname=manager.hostname,
        boot_id=manager.boot_id, working_dir=launch.working_dir, model=launch.model,
        request_json=stored_request(launch.normalized, request.timeout_s,
                                    launch.worktree.as_dict() if launch.worktree else None),
        reservations=launch.reservations, principal=request.principal,
        running=manager.ready_to_run(job_id, launch, ticket))
    return new, launch, ticket, submit


def _release(manager: JobManager,
             launches: Sequence[tuple[NewJob, CliLaunch, Ticket, SubmitRequest]]) -> None:
    """Nothing of a refused group stays held: tickets back, unused spool dirs gone."""
    for job, _, ticket, _ in launches:
        ticket.release()
        manager.discard_unused_run_dir(job)


async def _find(manager: JobManager, key: str) -> GroupSubmission | None:
    try:
        found = await manager.store.find_attempt_group(
            key, manager.settings.persistence.dedup_window_s)
        if found is None:
            return None
        attempts = await manager.store.list_attempts(found.group_id)
    except StoreUnavailable as exc:
        raise store_down(exc) from None
    log.info("attempt group joined", action="dedup_attempts", group_id=found.group_id)
    return GroupSubmission(found, [a.job_id for a in attempts], True)
