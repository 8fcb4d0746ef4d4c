"""A worker's side of jobs for other hosts (issue 42): publish what this host can run, and
claim the queued jobs it meets.

Capabilities are read again every CAPABILITIES_REFRESH_S (a CLI found, and whether it is
logged in, from the doctor's checks: a CLI logged out since is no longer offered) and each
claim passes the ones read last, so the store judges the job against this host as it is
now. A claimed job is this worker's own from then on: it is driven like one it admitted,
under the ordinary lease, cancel, adoption and re-queue rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from gateway.jobs.manager import JobManager
from gateway.jobs.placement import repo_names
from gateway.jobs.requests import SubmitRequest, stored_fields, with_worktree
from gateway.jobs.targets import CliLaunch, request_of_row, resolve_target
from gateway.jobs.worktrees.create import plan_worktree
from gateway.jobs.worktrees.remote import checkout_for, ensure_commit, remove_requested
from gateway.model import Completion, ErrorKind, GatewayError, InstanceRow, JobRow, JobStatus
from gateway.store.base import StoreUnavailable
from gateway.store.protocol_roles import WorkerClaim

log = structlog.get_logger(__name__)

CAPABILITIES_REFRESH_S = 30.0  # a login or an install changed since is seen within this

# What a host can run, as published: {"providers": {name: {"logged_in": ...}}, "labels": ...}
Capabilities = Mapping[str, Any]
# Reads them (off the event loop): a worker's, or a `serve` gateway's that claims too.
CapabilityReader = Callable[[], Awaitable[Capabilities]]


class Claimer:
    """Claims and starts the jobs this worker meets, up to `[worker] max_jobs` at once."""

    def __init__(self, manager: JobManager, identity: InstanceRow,
                 read_capabilities: CapabilityReader) -> None:
        self.manager = manager
        self.identity = identity
        self.read_capabilities = read_capabilities
        self.capabilities: Capabilities | None = None
        self._read_at = float("-inf")
        self.claimed = 0  # jobs this worker claimed (gateway_status, tests)

    async def refresh(self, force: bool = False) -> Capabilities:
        """Read this host's capabilities again when they are older than the refresh
        interval, and publish them on the instance row."""
        if force or self.capabilities is None \
                or time.monotonic() - self._read_at >= CAPABILITIES_REFRESH_S:
            capabilities = await self.read_capabilities()
            self._read_at = time.monotonic()
            if capabilities != self.capabilities:
                text = json.dumps(capabilities, sort_keys=True)
                # On the identity too: the lease keeper's re-registration (an upsert, after
                # instances GC removed a row whose lease lapsed in a store outage) carries
                # them, or the row would come back without them and offer nothing.
                self.identity.capabilities = text
                await self.manager.store.publish_capabilities(self.identity.instance_id, text)
                log.info("capabilities published", action="publish_capabilities",
                         providers=sorted(usable_providers(capabilities)))
            self.capabilities = capabilities
        return self.capabilities

    def claim_of(self, capabilities: Capabilities) -> WorkerClaim:
        worker = self.manager.settings.worker
        return WorkerClaim(
            instance_id=self.identity.instance_id, hostname=self.identity.hostname,
            boot_id=self.identity.boot_id, ttl_s=self.manager.settings.lease.ttl_s,
            providers=tuple(sorted(usable_providers(capabilities))),
            labels=dict(capabilities.get("labels") or {}),
            principals=tuple(worker.principals) or None,
            repos=tuple(repo_names(capabilities)))

    async def tick(self) -> list[JobRow]:
        """One claim: as many jobs as there is room for; returns the claimed rows."""
        manager = self.manager
        if not manager.admission.open or not manager.settings.worker.accept_remote:
            return []
        capabilities = await self.refresh()
        await self.serve_removals()
        room = manager.settings.worker.max_jobs - len(manager.local_job_ids())
        if room <= 0:
            return []
        rows = await manager.store.claim_jobs(self.claim_of(capabilities), room)
        for row in rows:
            self.claimed += 1
            await self._start(row)
        return rows

    async def serve_removals(self) -> None:
        """Remove the worktrees of this host's remote jobs whose submitting host applied
        or discarded their changes (a request in the store, served here on the loop)."""
        store = self.manager.store
        if not self.manager.settings.worker.repos:
            return
        with contextlib.suppress(StoreUnavailable):
            wanted = await store.worktree_removals(self.identity.hostname)
            if not wanted:
                return
            done = await asyncio.to_thread(remove_requested, self.manager.settings, wanted,
                                           self.identity.hostname)
            for job_id in done:
                await store.worktree_removed(job_id)
            log.info("remote worktrees removed", action="worktree_remove", job_ids=done)

    async def _start(self, row: JobRow) -> None:
        """Drive a claimed job here, as the owner that admitted it would have; one that
        cannot run here after all (its working_dir is missing on this host) ends failed
        with the reason, never left queued under a worker that will not run it."""
        manager = self.manager
        _, request = request_of_row(row.request_json)
        request.correlation_id = row.correlation_id
        request.principal = row.principal
        try:
            normalized = stored_fields(row.request_json)
            if normalized.get("isolation") == "worktree":
                await asyncio.to_thread(self._worktree_request, normalized, request)
            target = resolve_target(manager.settings, row.provider, request)
            if isinstance(target, CliLaunch) and target.repository is not None:
                target.worktree = plan_worktree(manager.settings, target.repository,
                                                request.base_ref, row.id,
                                                self.identity.instance_id)
            ticket = manager.limiter.acquire(row.provider)
        except GatewayError as err:
            log.warning("claimed job cannot run on this host", action="claim", job_id=row.id,
                        error=err.message)
            # A store that is down leaves the row ours, queued: the lease rules settle it.
            with contextlib.suppress(StoreUnavailable):
                await manager.store.complete(row.id, self.identity.instance_id, Completion(
                    status=JobStatus.FAILED, error_kind=err.kind,
                    error=f"On worker {self.identity.hostname}: {err.message}"))
            return
        if isinstance(target, CliLaunch) and target.worktree is not None:
            recorded = await self._record_plan(row, target.worktree.as_dict())
            if recorded is None:
                ticket.release()
                return
            row = recorded
        log.info("job claimed", action="claim", job_id=row.id, provider=row.provider)
        manager.start_local(row, target, ticket, request)

    async def _record_plan(self, row: JobRow, plan: dict[str, Any]) -> JobRow | None:
        """The claimed row with its worktree plan, written to the store before the run can
        start: a worker restarted mid-run adopts it from the row, settles the worktree and
        stores the patch (the plan names a path only this host knows). None: the job is no
        longer ours to start. A store that is down does not hold the run back: it starts,
        and only an adoption of it would lack the plan (logged)."""
        request_json = with_worktree(row.request_json, plan)
        try:
            if not await self.manager.store.record_worktree_plan(
                    row.id, self.identity.instance_id, request_json):
                log.info("claimed job not started: no longer this worker's", action="claim",
                         job_id=row.id)
                return None
        except StoreUnavailable as exc:
            log.warning("worktree plan not recorded; the run starts without it in the row",
                        action="claim", job_id=row.id, error=str(exc))
            return row
        return dataclasses.replace(row, request_json=request_json)


    def _worktree_request(self, normalized: Mapping[str, Any], request: SubmitRequest) -> None:
        """A worktree job's request as this host runs it: working_dir in this host's
        checkout of its `repo`, which has its base commit (fetched when missing). Raises
        GatewayError(worktree_error): the job fails, nothing runs. Blocking (git)."""
        repo = str(normalized.get("repo") or "")
        checkout = checkout_for(self.manager.settings, repo)
        if checkout is None:
            raise GatewayError(ErrorKind.WORKTREE_ERROR,
                               f"no checkout of {repo!r} in this host's [worker] repos.")
        ensure_commit(checkout, str(normalized.get("base_sha") or ""))
        subdir = str(normalized.get("subdir") or "")
        inside = checkout / subdir if subdir else checkout
        request.working_dir = str(inside if inside.is_dir() else checkout)


def usable_providers(capabilities: Capabilities) -> set[str]:
    """The providers found here and not known to be logged out."""
    providers = capabilities.get("providers") or {}
    return {name for name, facts in providers.items()
            if isinstance(facts, dict) and facts.get("logged_in") != "no"}
