"""The admitting side of jobs for other hosts (issue 42): while a remote job waits for a
worker it is this gateway's (its heartbeat keeps the lease), so this gateway tells why no
live host can take it (`unschedulable_reason`), ends it `no_worker` past
`[worker] queue_timeout_s`, and ends it `cancelled` when a cancel reaches it first.

Each is a conditional write that a worker's claim races (store/postgres/workers.py): a
claim that committed first wins, and the job is then the worker's to run or cancel.
"""

from __future__ import annotations

import contextlib

import structlog

from gateway.jobs.manager import JobManager
from gateway.jobs.placement import (
    CANCELLED_BEFORE_CLAIM,
    live_hosts,
    unschedulable_reason,
    waiting_remote,
)
from gateway.model import JobRow, JobStatus
from gateway.store.base import StoreUnavailable

log = structlog.get_logger(__name__)

REMOTE_BATCH = 500  # queued remote jobs one sweep looks at (newest first); the rest next time


async def cancel_unclaimed(manager: JobManager, row: JobRow) -> JobRow | None:
    """End a remote job of this gateway that waits unclaimed and has a cancel request. The
    cancel request was written first, so no claim can take it any more (the claim skips a
    requested cancel); complete()'s owner test loses to a claim that came before."""
    if not waiting_remote(row) or row.owner_instance != manager.instance_id:
        return None
    with contextlib.suppress(StoreUnavailable):
        return await manager.store.complete(row.id, manager.instance_id, CANCELLED_BEFORE_CLAIM)
    return None


async def sweep_remote(manager: JobManager) -> list[str]:
    """One pass over this gateway's waiting remote jobs; returns the ids ended no_worker."""
    store = manager.store
    if (store.backend != "postgres" or not manager.admission.open
            or not manager.owns_remote_jobs):
        return []
    rows = [row for row in await store.list_jobs(
        statuses=[JobStatus.QUEUED], owner_instance=manager.instance_id, limit=REMOTE_BATCH,
        with_output=False) if waiting_remote(row)]
    if not rows:
        return []
    for row in rows:
        if row.cancel_requested_at is not None:
            await cancel_unclaimed(manager, row)
    hosts = live_hosts(await store.list_instances(), await store.now())
    reasons: dict[str, str | None] = {}
    for row in rows:
        assert row.runs_on is not None  # waiting_remote
        reason = unschedulable_reason(row.provider, row.runs_on, hosts)
        if reason != row.unschedulable_reason:
            reasons[row.id] = reason
    await store.set_unschedulable(manager.instance_id, reasons)
    timeout_s = manager.settings.worker.queue_timeout_s
    failed = await store.fail_unscheduled(
        manager.instance_id, timeout_s,
        f"No live worker took it within [worker] queue_timeout_s ({timeout_s:g} s). Start a "
        f"worker that meets it (`agent-cli-gateway worker`, with accept_remote = true), or "
        f"submit it again with another runs_on.")
    if failed:
        log.warning("jobs for other hosts ended: no worker took them", action="no_worker",
                    job_ids=failed)
    return failed
