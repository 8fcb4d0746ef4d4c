"""Instance leases: heartbeat, lease reaper, instances GC, cancel poller, retention purge.

The invariant this file exists for (docs/architecture.md, Instance leases): **no job whose owner heartbeated
within `lease.ttl_s` is ever orphaned; every job whose owner is gone is orphaned within
`ttl_s + sweep_interval_s` of the owner's last heartbeat or of its process group's exit,
whichever is later.**

Why it holds:
- A job's lease is the later of its own `lease_deadline` (set when it was admitted and when
  it started) and its owner's instance lease, `gateway_instances.lease_expires_at`, which
  every heartbeat renews to `now + ttl_s`. One row renewed, whatever the job count; the
  reaper reads the owner's row with the job, in the same statement that flips it.
- The reaper's write re-checks both leases: on SQLite under the write lock (a heartbeat is
  serialized before or after the whole statement); on PostgreSQL after locking the rows of
  lapsed owners (`FOR UPDATE`), so no heartbeat of theirs commits while their jobs are
  judged, and owners live at the transaction's `now()` stay live through it.
- A live owner renews every `heartbeat_s <= ttl_s / 2`, so one late tick never lets a lease
  lapse. A tick that fires more than one interval late (the loop stalled, the process was
  stopped) skips the next sweep: an instance that was not running must not judge others on a
  stale view.
- The monotonic clock does not advance while the host is suspended; the wall clock (and the
  store's clock) does. So the store's clock is also compared with the monotonic one at every
  heartbeat and sweep: a step forward of more than `heartbeat_s` (a resume, a clock jump)
  means every peer on this host was frozen too and has not renewed yet, so nobody is judged
  for `ttl_s` (each live peer renews within `heartbeat_s <= ttl_s / 2`). And an instance
  judges only while its own lease, on the store's clock, was renewed within `ttl_s`.
- The reaper judges each job by its own lease and its own owner's, never by which instances
  exist, so a fresh instance starting can never orphan a live instance's job (the original
  bug). An owner whose row was collected holds no lease.
- A job whose process is provably alive on this host (same hostname and boot id, pid alive,
  not a zombie, same start time) is left alone until it exits; a bare pid is never trusted.
- Dead owners: their lease stops advancing, so the first sweep after it lapses (at most
  `sweep_interval_s` later) orphans their jobs.
Each loop is one named task; a loop never overlaps itself (the next tick is scheduled after
the current one ends) and a failing tick is logged and retried next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from gateway import proc
from gateway.config import LeaseConfig, Settings
from gateway.jobs.adoption import Adopter
from gateway.jobs.manager import JobManager
from gateway.jobs.notify.deliver import Deliverer
from gateway.jobs.remote import sweep_remote
from gateway.jobs.run import spool
from gateway.jobs.worktrees.gc import expire_worktrees
from gateway.model import FINAL_STATUSES, ErrorKind, InstanceRow, JobRow, JobStatus
from gateway.store.base import REAPER_BATCH_ROWS, RETENTION_BATCH_ROWS, JobStore, StoreReplaced
from gateway.store.gauges import WorstOfLastHour

log = structlog.get_logger(__name__)

# A claim lasts this share of sweep_interval_s: the loops' ticks drift by milliseconds, and a
# claim of the whole interval would make the next tick of the last sweeper just miss it.
SWEEP_CLAIM_SHARE = 0.9
RETENTION_MAX_BATCHES = 100  # a pass deletes at most 1M rows: the next pass goes on
PURGE_INTERVAL_S = 300.0  # retention is measured in days: purging every 5 minutes is plenty
# How long after its lease lapsed a job stays with an owner proven alive on this host (pid and
# start time: SIGSTOPped, stalled, slow) before a peer takes it over; and how long a queued
# job of this host waits to be re-queued by its host's gateways before it may be orphaned.
# Paperclip #21046: old and new servers serve together for minutes during an upgrade.
STALLED_OWNER_GRACE_S = 300.0
# A spool of an ended job that nothing changed for this long is one its writer left behind
# (a live writer removes it milliseconds after the terminal write); per sweep, at most
# SETTLED_SPOOL_BATCH such spools are checked against their row.
SETTLED_SPOOL_IDLE_S = 2.0
SETTLED_SPOOL_BATCH = 16


# How long stop() waits for its cancelled loops to end (each ends within a store call).
STOP_LOOPS_S = 10.0


def _where(task: asyncio.Task[object]) -> str:
    """Where a task waits: its innermost frames, for a log line."""
    frames = task.get_stack(limit=8)
    return " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))


class LeaseKeeper:
    """Owns this instance's lease and the background loops of its `[lease]` config section."""

    def __init__(self, settings: Settings, store: JobStore, manager: JobManager,
                 identity: InstanceRow, spool_root: Path) -> None:
        self.settings = settings
        self.lease: LeaseConfig = settings.lease
        self.store = store
        self.manager = manager
        self.identity = identity
        self.spool_root = spool_root  # the spools the sweeps remove and adoption reads
        self.registered = False
        self.heartbeat_failures = 0
        self.skip_next_sweep = False
        self.last_heartbeat_ok: float | None = None
        # The store's clock when our lease was last renewed (read just before the write,
        # so never later than the renewal): an instance judges others only while it is
        # within ttl_s.
        self.renewed_at: float | None = None
        self._clock_offset: float | None = None  # store clock minus monotonic, last seen
        self._judge_after = 0.0  # monotonic: no sweep judges before this (a clock step)
        self._tasks: list[asyncio.Task[None]] = []
        self._last_purge = 0.0
        self.stalled_owner_grace_s = STALLED_OWNER_GRACE_S
        self.adopter = Adopter(manager, store, identity, spool_root,
                               lambda: self.stalled_owner_grace_s)
        # How long each renewal was pending, from its tick to the store's answer (Paperclip's
        # renewalPendingMs): a saturated pool or a slow database shows here long before a
        # lease lapses (`gateway_status`).
        self.renewal_pending_ms = WorstOfLastHour()
        self.sweeps_run = 0  # reaper passes this instance made (one sweeper per interval)
        # Completion notices (issue 40): every live gateway delivers, one claim per notice.
        self.deliverer = Deliverer(settings, store, identity.instance_id)
        manager.on_job_end(self.deliverer.wake)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Register (admission turns on only if that worked), settle the jobs of gateways
        that are gone (before the first tool call is served), and start every loop."""
        await self.register()
        try:
            await self.adopter.sweep()
        except Exception as exc:
            log.warning("adoption at start failed; the next sweep retries", action="adopt",
                        error=repr(exc))
        loops: dict[str, tuple[float, Callable[[], Awaitable[object]]]] = {
            "heartbeat": (self.lease.heartbeat_s, self.heartbeat_once),
            "reaper": (self.lease.sweep_interval_s, self.sweep_tick),
            "cancel_poller": (self.lease.cancel_poll_s, self.poll_cancels_once),
        }
        if self.store.backend == "postgres":  # jobs for other hosts exist there only
            loops["remote_queue"] = (self.lease.cancel_poll_s, self.sweep_remote_once)
        for name, (interval, tick) in loops.items():
            self.run_loop(name, interval, tick)
        # Completion notices (issue 40): polls less while idle, woken by a job's end here.
        self._tasks.append(asyncio.create_task(self.deliverer.run(), name="notices"))

    def run_loop(self, name: str, interval: float,
                 tick: Callable[[], Awaitable[object]]) -> None:
        """Run `tick` every `interval` s beside the lease loops, stopped with them (a
        worker's claim loop)."""
        self._tasks.append(asyncio.create_task(self._loop(name, interval, tick), name=name))

    async def sweep_remote_once(self) -> list[str]:
        """This gateway's jobs for other hosts that wait for a worker (remote.py)."""
        return await sweep_remote(self.manager)

    async def stop(self) -> None:
        """Cancel every loop and collect them, logging any error that was not a cancel."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        # asyncio.wait, not `suppress(CancelledError): await task` per task: that swallowed
        # the cancel of the caller itself. Bounded: a loop that does not end once cancelled
        # (a tick stuck in a call that ignores it) must not keep the gateway from leaving.
        done, stuck = await asyncio.wait(tasks, timeout=STOP_LOOPS_S)
        for task in stuck:
            log.error("lease loop did not stop when cancelled; leaving it", action="stop_loops",
                      loop=task.get_name(), waiting_in=_where(task))
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("lease loop failed", action="stop_loops", loop=task.get_name(),
                          error=repr(task.exception()))

    async def _loop(self, name: str, interval: float,
                    tick: Callable[[], Awaitable[object]]) -> None:
        """Run `tick` every `interval` s until cancelled; what a tick returns (the reaper's
        flipped rows, for tests) is not the loop's business."""
        expected = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, expected - time.monotonic()))
            late = time.monotonic() - expected
            if name == "heartbeat" and late > interval:
                # The loop stalled or the process was stopped: our view is stale, so the
                # next sweep judges nobody.
                self.skip_next_sweep = True
                log.warning("heartbeat fired late", action="heartbeat_drift", late_s=round(late, 3))
            try:
                await tick()
            except Exception as exc:
                log.warning("lease tick failed", action=name, error=repr(exc))
            expected = time.monotonic() + interval

    # -- registration and heartbeat --------------------------------------------------------
    async def register(self) -> bool:
        try:
            before = await self._read_clock()
            await self.store.register_instance(self.identity, self.lease.ttl_s)
        except Exception as exc:
            self._note_replaced(exc)
            log.warning("instance registration failed; admission stays off",
                        action="register", error=repr(exc))
            self.registered = False
            self.manager.admission.lease_lost()
            return False
        self.registered = True
        self.heartbeat_failures = 0
        self.last_heartbeat_ok = time.monotonic()
        self.renewed_at = before
        if not self.manager.admission.lease_held:
            log.info("durable admission on", action="register",
                     instance_id=self.identity.instance_id)
        self.manager.admission.lease_renewed()
        return True

    async def heartbeat_once(self) -> None:
        if not self.registered:
            await self.register()
            return
        pending_since = time.monotonic()
        try:
            before = await self._read_clock()
            # The worst wait so far rides along: `instances` shows it from the row, and
            # `gateway_status` from the same gauge (one source).
            renewed = await self.store.heartbeat(self.identity.instance_id, self.lease.ttl_s,
                                                 self.renewal_pending_ms.worst())
        except Exception as exc:
            self.renewal_pending_ms.record((time.monotonic() - pending_since) * 1000)
            self._note_replaced(exc)
            self.heartbeat_failures += 1
            log.warning("heartbeat failed", action="heartbeat", failures=self.heartbeat_failures,
                        error=repr(exc))
            admission = self.manager.admission
            if self.heartbeat_failures >= self.lease.max_heartbeat_failures and admission.lease_held:
                admission.lease_lost()
                log.error("durable admission off after repeated heartbeat failures",
                          action="heartbeat", failures=self.heartbeat_failures)
            return
        self.last_heartbeat_ok = time.monotonic()
        self.renewal_pending_ms.record((self.last_heartbeat_ok - pending_since) * 1000)
        if renewed:
            self.renewed_at = before
        if renewed == 0 or not self.manager.admission.lease_held:
            # The instance row is gone (GC'd while we were stopped) or we had failed closed:
            # re-register (an upsert) before admitting again; never trust a heartbeat that
            # renewed nothing.
            await self.register()
        else:
            self.heartbeat_failures = 0

    def _note_replaced(self, exc: Exception) -> None:
        """The store's file was deleted or replaced: admission goes off at once (not after
        max_heartbeat_failures) and stays off, saying why, until the gateway restarts."""
        if isinstance(exc, StoreReplaced):
            self.manager.admission.store_replaced(str(exc))

    # -- clock steps -----------------------------------------------------------------------
    async def _read_clock(self) -> float:
        """The store's clock, compared with the monotonic clock read as it answers: a
        forward step (a suspend and resume, a clock jump) starts a quiet period of ttl_s in
        which nobody is judged."""
        store_now = await self.store.now()
        self._watch_clock(store_now, time.monotonic())
        return store_now

    def _watch_clock(self, store_now: float, mono: float) -> None:
        offset = store_now - mono
        previous, self._clock_offset = self._clock_offset, offset
        if previous is None:
            return
        step = offset - previous
        # A step smaller than heartbeat_s is inside every live lease's slack (a lease is
        # renewed every heartbeat_s and lasts ttl_s >= 2 * heartbeat_s); a slow round trip
        # to the store only ever looks like a small step.
        if step > self.lease.heartbeat_s:
            self._judge_after = mono + self.lease.ttl_s
            log.warning("the store clock stepped ahead of the monotonic clock (suspend and "
                        "resume, or a clock jump): judging no other instance for ttl_s",
                        action="clock_step", step_s=round(step, 3), quiet_s=self.lease.ttl_s)

    def may_judge(self, store_now: float) -> bool:
        """Whether a sweep may judge others now: our own lease was renewed within ttl_s on
        the store's clock, and no clock step happened within the last ttl_s."""
        return (self.renewed_at is not None
                and store_now - self.renewed_at < self.lease.ttl_s
                and time.monotonic() >= self._judge_after)

    # -- reaper, GC, retention --------------------------------------------------------------
    def _provably_alive(self, row: JobRow) -> bool:
        return (
            row.hostname == self.identity.hostname
            and row.boot_id == self.identity.boot_id
            and row.pid is not None
            and row.pid_started_at is not None
            and proc.is_process_alive(row.pid, row.pid_started_at)
        )

    def _may_orphan(self, row: JobRow, owner: InstanceRow | None, now: float) -> bool:
        """Whether the reaper may write `orphaned` on a candidate (its lease and its owner's
        lapsed): only when no gateway can settle it any more, since `orphaned` is final.

        On this host: never while its process is provably alive; never while its owner is
        proven alive here (SIGSTOPped, stalled), now or when this sweep's adoption judged it
        (an owner killed in between is adopted from next sweep), and never while it is
        queued (the adopter re-queues it once its owner is proven gone: nothing runs
        meanwhile), until the stalled-owner grace after the lease lapsed: the grace this
        sweep's adoption judged by, so what it left to a stalled owner is never orphaned in
        the same sweep. Adoption ran first in this sweep and looked at this job (or at every
        candidate), so a job of a gone owner that is still a candidate is one nobody here
        can settle. On another host the owner cannot be probed: as before, at its lease."""
        if self._provably_alive(row):
            return False
        if row.hostname != self.identity.hostname:
            return True
        if self.adopter.left_unseen(row.id):
            return False  # adoption was cut short before it: the next sweep looks again
        lapsed = max(
            row.lease_deadline.timestamp() if row.lease_deadline is not None else 0.0,
            owner.lease_expires_at.timestamp() if owner and owner.lease_expires_at else 0.0)
        # `now` was read before this sweep's adoption read its own: a grace passed here
        # passed there too, and adoption took the job over (or lost it to a peer's CAS).
        if now - lapsed >= self.adopter.grace_s:
            return True
        return not (row.status is JobStatus.QUEUED
                    or self.adopter.alive_at_last_sweep(row.owner_instance)
                    or self.adopter.owner_alive_here(owner))

    async def sweep_tick(self) -> list[JobRow]:
        """The reaper loop's tick: a pass only when this interval's sweep of this host is
        ours. However many gateways share the store (one per client window), one of them
        per host sweeps per interval (issue 29): the probes of a host's pids stay with that
        host's gateways, and the rest skip at once. Only an instance fit to judge claims, so
        an unfit one cannot use up an interval."""
        now = await self._sweep_gate()
        if now is None:
            return []
        task = f"reaper@{self.identity.hostname}"
        if not await self.store.claim_sweep(task, self.lease.sweep_interval_s * SWEEP_CLAIM_SHARE):
            return []
        return await self._sweep(now)

    async def sweep_once(self) -> list[JobRow]:
        """One reaper pass now, whoever swept last: what a test drives (the loop goes
        through sweep_tick)."""
        now = await self._sweep_gate()
        return [] if now is None else await self._sweep(now)

    async def _sweep_gate(self) -> float | None:
        """The store's clock when this instance may judge others now, else None."""
        if self.skip_next_sweep:
            self.skip_next_sweep = False
            log.info("sweep skipped after a late heartbeat", action="sweep")
            return None
        if not self.manager.admission.open:
            return None  # an instance that cannot renew its own lease judges nobody
        now = await self._read_clock()
        if not self.may_judge(now):
            log.info("sweep skipped: our own lease is not fresh on the store clock, or the "
                     "clock stepped", action="sweep")
            return None
        return now

    async def _sweep(self, now: float) -> list[JobRow]:
        """Orphan jobs whose lease (their own and their owner's) lapsed and that no gateway
        can settle any more (see _may_orphan), then GC, release the budget reservations of
        ended jobs, and purge."""
        self.sweeps_run += 1
        # Adoption first (it judges owners too, so only after the gate above): a job whose
        # owner is proven gone is settled here (adopted or re-queued) rather than orphaned.
        await self.adopter.sweep()
        grace = self.lease.http_job_grace_s
        candidates = await self.store.list_expired_candidates(grace, REAPER_BATCH_ROWS)
        owners = ({i.instance_id: i for i in await self.store.list_instances()}
                  if candidates else {})
        # A remote job that never started goes back to the worker pool instead (any worker
        # may run it: nothing of it is on its last owner's host).
        pooled = set(await self.store.return_to_pool(
            self.identity, self.lease.ttl_s, grace,
            [row.id for row in candidates if row.status is JobStatus.QUEUED]))
        if pooled:
            self.manager.owns_remote_jobs = True
            log.info("jobs for other hosts back in the pool: their owner's lease lapsed "
                     "before they started", action="return_to_pool", job_ids=sorted(pooled))
        candidates = [row for row in candidates if row.id not in pooled]
        # Only the candidates judged here are flipped: the probed ones minus those that a
        # gateway may still settle.
        judged = [row.id for row in candidates
                  if self._may_orphan(row, owners.get(row.owner_instance or ""), now)]
        orphaned = (await self.store.recover_expired_leases(grace, judged, self.identity.hostname)
                    if judged else [])
        for row in orphaned:
            log.warning("job orphaned: its owner's lease expired", action="recover_expired_leases",
                        job_id=row.id, owner_instance=row.owner_instance, provider=row.provider,
                        final=row.hostname == self.identity.hostname)
        await self._gc_instances()
        await self._remove_settled_spools()
        # What orphaned jobs still hold of a budget goes back (each reservation exactly once).
        await self.store.release_reservations()
        now = time.monotonic()
        # Retention is cluster-wide: one purge per PURGE_INTERVAL_S among all gateways.
        if (now - self._last_purge >= PURGE_INTERVAL_S
                and await self.store.claim_sweep("retention", PURGE_INTERVAL_S)):
            self._last_purge = now
            await self._purge()
            await expire_worktrees(self.settings, self.manager.hostname, self.store)
        return orphaned

    async def _purge(self) -> None:
        """Retention, in batches of RETENTION_BATCH_ROWS: each its own short transaction, so
        a backlog (a first start after months, a lowered retention_days) never holds a long
        lock on `jobs`; at most RETENTION_MAX_BATCHES per pass, the rest next pass."""
        for _ in range(RETENTION_MAX_BATCHES):
            purged = await self.store.purge_terminal(
                self.settings.persistence.retention_days * 86400, RETENTION_BATCH_ROWS)
            for job_id in purged:
                shutil.rmtree(spool.job_dir(self.spool_root, job_id), ignore_errors=True)
            if len(purged) < RETENTION_BATCH_ROWS:
                return

    async def _remove_settled_spools(self) -> None:
        """Remove the spools of this state dir's ended jobs that their terminal writer left:
        one killed or stopped for good between its write and its removal (the portable chaos
        run: SIGSTOP 3 ms after the write, then SIGKILL) leaves them, and no one else would
        before retention. Only spools idle for SETTLED_SPOOL_IDLE_S and at most
        SETTLED_SPOOL_BATCH per pass (one row read each). An orphaned job's is left to
        retention: its run may still be writing it."""
        job_ids = await asyncio.to_thread(spool.idle_job_ids, self.spool_root,
                                          SETTLED_SPOOL_IDLE_S, time.time(),
                                          set(self.manager.local_job_ids()))
        for job_id in job_ids[:SETTLED_SPOOL_BATCH]:
            row = await self.store.get_job(job_id, with_output=False)
            # A final status is for good (no transition leaves it): nothing in the spool is
            # anyone's evidence any more; the row holds the output.
            if row is not None and row.status in FINAL_STATUSES:
                await asyncio.to_thread(spool.remove_job_dir, self.spool_root, job_id)
                log.info("spool of an ended job removed", action="settled_spool",
                         job_id=job_id, status=str(row.status))

    async def _gc_instances(self) -> None:
        """Collect the instance rows gone for instance_gc_s: of this host only, and never one
        whose owner is alive by pid and start time (SIGSTOPped past ttl_s + instance_gc_s).
        Adoption reads a collected owner as proven gone, so a live owner's collected row
        re-ran its in-flight API call (issue 23, item 5); another host's rows are left to
        the gateways of that host, which can check their pids."""
        alive = [row.instance_id for row in await self.store.list_instances()
                 if not self.adopter.owner_gone(row)]
        await self.store.gc_instances(self.lease.instance_gc_s, self.identity.hostname, alive)

    # -- cross-instance cancel --------------------------------------------------------------
    async def poll_cancels_once(self) -> None:
        """Stop this instance's jobs whose row carries a cancel request. No query when idle."""
        if not self.manager.local_job_ids():
            return
        for job_id in await self.store.list_cancel_requested(self.identity.instance_id):
            if self.manager.cancel_local(job_id, ErrorKind.CANCELLED):
                log.info("cancel requested through the job row", action="poll_cancels",
                         job_id=job_id)

    async def mark_stopped(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.mark_instance_stopped(self.identity.instance_id)
