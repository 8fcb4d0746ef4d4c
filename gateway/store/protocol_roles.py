"""Three roles of the JobStore protocol (base.py composes them into JobStore): WorkerQueue
(worker hosts), AttemptGroups (attempt groups) and NoticeOutbox (completion notices).

Moved out of base.py whole when they put it over the module cap: each is one concern of the
store with its own vocabulary (WorkerClaim below, store/attempts.py, store/outbox.py),
and each is implemented by one mixin per backend (worker_queue.py, attempt_groups.py and
notice_outbox.py in memory/, sqlite/ and postgres/).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gateway.model import InstanceRow, JobRow, NewJob
from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    GroupEnd,
    GroupStatus,
    NewAttemptGroup,
)
from gateway.store.outbox import CLAIM_BATCH, NOTICE_LIST_LIMIT, Notice, Settlement


@dataclass(frozen=True, slots=True)
class WorkerClaim:
    """What a worker can take (claim_jobs): its identity, and its capabilities as read at
    claim time, so a CLI logged out since its last publication is not chosen."""

    instance_id: str
    hostname: str
    boot_id: str
    ttl_s: float
    providers: tuple[str, ...]  # found and logged in (or cannot tell) now
    labels: Mapping[str, str]
    principals: tuple[str, ...] | None = None  # None: anyone's jobs
    # The repositories it holds: the names in [worker] repos and their origin URLs (a
    # worktree job's `repo` names one of them).
    repos: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RemotePatch:
    """What a worker stored of a worktree job it ran (issue 42): the branch's changes
    against base_sha, or None when they were over [worker] max_patch_bytes (the branch is
    kept on the worker)."""

    job_id: str
    hostname: str
    base_sha: str
    tip: str
    size: int
    patch: bytes | None
    discard_requested: bool = False


@runtime_checkable
class WorkerQueue(Protocol):
    """Jobs that run on another host (issue 42, `runs_on` other than "here"): what workers
    publish, what they claim, and the submitting owner's sweep of what nobody can take.
    PostgreSQL only: on SQLite and memory (one host) admission refuses such a job, so none
    exists; their claim finds nothing and their sweeps change nothing."""

    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        """Write this instance's capabilities (JSON) on its row; False if the row is gone."""

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        """Take up to `limit` queued, unclaimed remote jobs this worker meets (provider in
        `claim.providers`, selector matched by its hostname or labels, principal allowed),
        oldest first: owner_instance, hostname and boot_id become the worker's, claimed_at =
        now, the lease restarts. Each job goes to exactly one claimer whoever races; a job
        with a cancel request is never claimed. Light rows, as get_job(with_output=False)."""

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        """The reaper's alternative to orphaning a remote job that never started: those of
        `job_ids` still queued, remote, without a cancel request and whose lease (theirs and
        their owner's) lapsed, as list_expired_candidates judges it, are taken by
        `taker` (a live gateway: its heartbeat keeps their lease) with their
        claim cleared, so any worker that meets them claims them again. Nothing ran (a run
        starts only after the queued -> running CAS), so nothing can run twice. Returns the
        ids taken (counted as a re-queue)."""

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        """Write each named job's unschedulable_reason (None clears it), only while it is
        still queued, unclaimed and owned by `owner_instance`. Returns rows changed."""

    async def record_worktree_plan(self, job_id: str, owner_instance: str,
                                   request_json: str) -> bool:
        """Replace the request of a remote job `owner_instance` claimed with one that names
        the worktree it planned, only while the job is still queued, claimed and its: the
        claimer writes it before the run starts, so whoever adopts the run on this host
        finds the plan in the row (and settles the worktree and stores its patch). False:
        the job is no longer this claimer's to start."""

    async def put_patch(self, patch: RemotePatch) -> bool:
        """Store the patch of a worktree job this worker ran (once: False if one exists)."""

    async def get_patch(self, job_id: str) -> RemotePatch | None:
        """The stored patch of a remote worktree job (None: none stored)."""

    async def request_worktree_removal(self, job_id: str) -> bool:
        """Ask the host that holds the job's worktree to remove it (applied or discarded
        on the submitting host): True for the first request only."""

    async def worktree_removals(self, hostname: str) -> list[str]:
        """The jobs whose worktree on `hostname` a submitting host asked to remove and
        that no worker there has removed yet."""

    async def worktree_removed(self, job_id: str) -> bool:
        """Record that the job's worktree was removed (True the first time only)."""

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        """End `failed` (error_kind no_worker) this owner's remote jobs that stayed queued
        and unclaimed for more than queue_timeout_s (since admission or their last
        re-queue); never one with a cancel request. Returns their ids."""


@runtime_checkable
class AttemptGroups(Protocol):
    """Attempt groups (issue 39; store/attempts.py says the model): one admission of N jobs,
    the check of each attempt claimed and recorded once, the group's end and its pick."""

    async def insert_attempt_group(self, group: NewAttemptGroup, jobs: Sequence[NewJob],
                                   ttl_s: float) -> AttemptGroupRow:
        """Admit a whole group in one transaction: its row (status running), its jobs (as
        insert_job, in order: the ordinal of each attempt is its index), each job's budget
        reservations and one attempt row per job (check pending). All of it or nothing:
        BudgetExceeded when one reservation does not fit, DuplicateActiveGroup when a
        running group holds `group.dedup_key` (the partial unique index decides the race),
        DuplicateActiveJob when a job's request key is taken (a caller's bug: attempt jobs
        carry keys of their own)."""

    async def find_attempt_group(self, dedup_key: str,
                                 dedup_window_s: float) -> AttemptGroupRow | None:
        """The group an identical call joins: the running one with that key (any age), or
        the newest that ended `done` within dedup_window_s."""

    async def get_attempt_group(self, group_id: str) -> AttemptGroupRow | None: ...

    async def list_attempt_groups(self, *, principal: str | None = None,
                                  status: GroupStatus | None = None,
                                  limit: int = 50) -> list[AttemptGroupRow]:
        """Newest first; `principal`: only the groups it made; `status`: only those in it
        (the coordinator's sweep reads the running ones)."""

    async def list_attempts(self, group_id: str) -> list[AttemptRow]:
        """The group's attempts in submission order (ordinal)."""

    async def get_attempt(self, job_id: str) -> AttemptRow | None:
        """The attempt row of a job, None when the job is not an attempt."""

    async def claim_check(self, job_id: str, claimer: str) -> bool:
        """CAS check pending -> running, recording who runs it: True for exactly one
        caller, ever (a check runs at most once)."""

    async def skip_check(self, job_id: str, reason: str) -> bool:
        """CAS check pending -> skipped with the reason it never runs."""

    async def record_check(self, job_id: str, result: CheckResult) -> bool:
        """CAS check running -> done with its result: the first write wins."""

    async def end_attempt_group(self, end: GroupEnd) -> bool:
        """CAS the group from one of `end.expected` to `end.status` (winner, judge: set
        when given, kept otherwise). False: the group was not in an expected status."""


@runtime_checkable
class NoticeOutbox(Protocol):
    """The completion-notice outbox (issue 40; store/outbox.py). Notices are added by the
    terminal writes themselves (complete, recover_expired_leases) in their transaction;
    these methods are the deliverers' compare-and-sets and the operator's reads."""

    async def claim_notices(self, instance_id: str, lease_s: float,
                            limit: int = CLAIM_BATCH) -> list[Notice]:
        """Claim up to `limit` due notices for `instance_id` until now + lease_s: each one
        neither delivered nor failed, due (next_attempt_at passed), and unclaimed or its
        claim lapsed; its `attempts` counts this claim. Of any number of racers exactly one
        claims a notice. Returns them as claimed."""

    async def record_notice_sink(self, notice_id: str, instance_id: str, sink: str) -> bool:
        """Add `sink` to the notice's sinks_done while `instance_id` holds its claim (a
        later attempt sends only to the sinks not done). False: the claim is not held."""

    async def settle_notice(self, notice_id: str, instance_id: str, outcome: Settlement,
                            retry_in_s: float = 0.0, error: str | None = None) -> bool:
        """End the claim `instance_id` holds: `delivered` or `skipped` (delivered_at = now),
        `failed` (failed_at = now), or `retry` (released, due again in retry_in_s), with
        `error` as its last_error. False: the claim is not held (lapsed and taken)."""

    async def list_notices(self, *, failed_only: bool = False,
                           limit: int = NOTICE_LIST_LIMIT) -> list[Notice]:
        """The newest notices first (only failed ones with failed_only)."""

    async def count_failed_notices(self) -> int:
        """How many notices ended failed (gateway_status)."""
