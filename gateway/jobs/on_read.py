"""What the operator's read commands (`jobs list|show|wait|result`, `instances`) use from
the job machinery, without loading it.

`jobs list` must answer like a small program (issue #45: under 250 ms on a quiet box): the
job manager, the adopter and the worktree code behind a finalization are a third of a
second of imports, and a read needs them only for a running job of this host whose run has
already ended. So the cheap checks are here and `gateway.jobs.finalizer` is imported only
for such a job. The lease rule is here for the same reason: `jobs show` and `instances`
judge an owner's lease and need nothing else of `gateway.jobs.leases`.
"""

from __future__ import annotations

import structlog

from gateway import proc
from gateway.config import Settings
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.spool import run_dir, spool_root
from gateway.model import InstanceRow, JobRow, JobStatus
from gateway.store.base import JobStore

log = structlog.get_logger(__name__)


def instance_lease_held(instance: InstanceRow, now: float) -> bool:
    """Whether `instance` still holds its lease at `now` (the store's clock, epoch s): the
    reaper's rule for an owner (gateway/store/*_sql.py `_LEASE_EXPIRED`), for the readers
    that show or judge it outside the store (`jobs cancel`, `jobs show`, `instances`).
    A stopped instance keeps its lease until it lapses, as the reaper sees it."""
    expires = instance.lease_expires_at
    return expires is not None and expires.timestamp() >= now


def instance_lease_state(instance: InstanceRow, now: float) -> str:
    """How an instance's lease reads to a person (`instances`, the dashboard): `live` (held,
    not stopped), `stopping` (stopped, lease not yet lapsed: its jobs are still covered),
    `stopped`, or `lapsed` (it stopped renewing without saying goodbye)."""
    held = instance_lease_held(instance, now)
    if instance.stopped_at is None:
        return "live" if held else "lapsed"
    return "stopping" if held else "stopped"


async def finalize_on_read(settings: Settings, store: JobStore, job: JobRow) -> JobRow:
    """The operator commands' read (`jobs show|wait|result|list`): a running job of this
    host whose run ended (its end record is on the spool) and whose owner is proven gone is
    finalized first, so the answer read is the true one; the row as it is then."""
    if (job.status is not JobStatus.RUNNING or job.transport != "process"
            or job.hostname != proc.hostname()):
        return job
    spool = run_dir(spool_root(settings.state_dir), job)
    if sup.read_record(spool, sup.END_NAME) is None:
        return job
    # Only now the job machinery: a run ended and its row still says running.
    from gateway.jobs.finalizer import finalize_run  # deferred: start-up

    outcome = await finalize_run(settings, spool, store)
    if outcome != "finalized":
        return job
    log.info("finalized on read: its run had ended and its owner is gone",
             action="finalize_on_read", job_id=job.id)
    return await store.get_job(job.id, with_output=False) or job
