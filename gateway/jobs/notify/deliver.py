"""The deliverer: claims due notices from the store's outbox and sends each to the
`[notify]` sinks, as a background task of every gateway and of a supervisor's finalizer.

The exactly-once argument (docs/operations.md, Notices): a notice is written once, with the
terminal write of its job. A deliverer sends it only under a claim (a compare-and-set with a
lease), records each sink done under that claim right after the sink accepted it, and
settles it under that claim. So a sink gets it twice only when a deliverer died (or stalled
past the claim's lease) between a sink's acceptance and the record of it; then the next
deliverer sends it again with the same `id`, which the sink can deduplicate by. Nothing is
lost: a notice stays due until it is settled, whoever crashed.

The filter (`on`, `min_duration_s`) is applied here, at delivery, by the deliverer's own
config: the store records every end (the operator's `notices` lists them all), and a notice
filtered out is settled `skipped` in the same claim that would have sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from gateway.backoff import Backoff, woken_or_after
from gateway.childenv import secret_env_names
from gateway.config import Settings
from gateway.jobs.notify.sinks import SinkError, send
from gateway.store.base import JobStore, StoreUnavailable
from gateway.store.outbox import CLAIM_BATCH, Notice, Settlement

log = structlog.get_logger(__name__)

POLL_S = 1.0  # a live gateway looks for due notices this often while it finds some
# Finding none, it looks less and less often, up to this: forty idle windows on one
# PostgreSQL must not hold its connections with a read a second each. A job this gateway
# ends wakes it at once (JobManager.on_job_end); one ended elsewhere (its owner gone
# mid-delivery, a finalizer) waits at most this long.
IDLE_POLL_MAX_S = 15.0
# A claim outlives every sink's timeout in turn, plus this margin (a slow store write).
CLAIM_MARGIN_S = 30.0
# A failed delivery is retried after 5 s, 10 s, 20 s ... at most 10 minutes apart: a
# webhook down for a minute is reached again within seconds of coming back.
RETRY = Backoff(first_s=5.0, max_s=600.0, jitter=0.2)
STORE_DOWN = Backoff(first_s=1.0, max_s=30.0, jitter=0.2)

Listener = Callable[[Notice], Awaitable[None]]


class Deliverer:
    """Delivers notices as `instance_id` (a gateway's instance id, or a finalizer's)."""

    def __init__(self, settings: Settings, store: JobStore, instance_id: str,
                 on_notice: Listener | None = None) -> None:
        self.settings = settings
        self.store = store
        self.instance_id = instance_id
        self.on_notice = on_notice  # told of each notice claimed (the MCP sessions' hook)
        self._secret_names = secret_env_names(settings)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Sweep now: a job ended here, its notice is due."""
        self._wake.set()

    @property
    def claim_lease_s(self) -> float:
        config = self.settings.notify
        return config.timeout_s * max(len(config.sinks), 1) + CLAIM_MARGIN_S

    async def sweep(self) -> int:
        """Claim the due notices (one batch) and settle each; returns how many."""
        notices = await self.store.claim_notices(self.instance_id, self.claim_lease_s,
                                                 CLAIM_BATCH)
        if notices:
            await asyncio.gather(*(self._deliver(notice) for notice in notices))
        return len(notices)

    async def drain(self, max_batches: int = 50) -> int:
        """Sweep until nothing is due (or max_batches): the finalizer's one pass."""
        total = 0
        for _ in range(max_batches):
            count = await self.sweep()
            total += count
            if count < CLAIM_BATCH:
                break
        return total

    async def run(self) -> None:
        """Forever: sweep, then wait POLL_S while notices come, doubling up to
        IDLE_POLL_MAX_S while none do (at once again after a full batch or a wake)."""
        failures, idle = 0, 0  # store failures, sweeps that found nothing, in a row
        while True:
            self._wake.clear()
            try:
                found = await self.sweep()
                failures = 0
            except StoreUnavailable as exc:
                failures += 1
                log.warning("notice delivery: store unavailable", action="deliver_notices",
                            error=str(exc))
                await asyncio.sleep(STORE_DOWN.wait(failures))
                continue
            except Exception as exc:  # one bad notice must not end delivery for good
                log.warning("notice delivery failed", action="deliver_notices", error=repr(exc))
                found = 0
            if found >= CLAIM_BATCH:
                continue
            idle = 0 if found else idle + 1
            wait = Backoff(first_s=2 * POLL_S, max_s=IDLE_POLL_MAX_S).delay(idle) if idle \
                else POLL_S
            await woken_or_after(self._wake, wait)

    async def _deliver(self, notice: Notice) -> None:
        config = self.settings.notify
        if self.on_notice is not None:
            with contextlib.suppress(Exception):
                await self.on_notice(notice)
        if notice.attempts > config.max_attempts:  # deliverers died on it that often
            await self._settle(notice, "failed", error=notice.last_error or
                               "every delivery attempt was interrupted")
            return
        reason = self.skip_reason(notice)
        if reason is not None:
            await self._settle(notice, "skipped", error=reason)
            return
        payload = notice.payload()
        errors = []
        for sink in config.sinks:
            if sink in notice.sinks_done:
                continue
            try:
                await send(sink, config, payload, self._secret_names)
            except SinkError as exc:
                errors.append(f"{sink}: {exc}")
                continue
            if not await self.store.record_notice_sink(notice.id, self.instance_id, sink):
                return  # the claim lapsed and was taken: the new holder settles it
        if not errors:
            await self._settle(notice, "delivered")
        elif notice.attempts >= config.max_attempts:
            await self._settle(notice, "failed", error="; ".join(errors))
            log.warning("notice delivery failed for good", action="notice_failed",
                        notice_id=notice.id, attempts=notice.attempts, error="; ".join(errors))
        else:
            await self._settle(notice, "retry", error="; ".join(errors),
                               retry_in_s=RETRY.wait(notice.attempts))

    def skip_reason(self, notice: Notice) -> str | None:
        """Why this notice is not sent under `[notify]`, or None to send it."""
        config = self.settings.notify
        if not config.sinks:
            return "no sink configured"
        if notice.status not in config.on:
            return f"{notice.status} is not in [notify] on"
        if notice.duration_s is not None and notice.duration_s < config.min_duration_s:
            return f"ran {notice.duration_s:.1f} s, under min_duration_s"
        return None

    async def _settle(self, notice: Notice, outcome: Settlement, *, error: str | None = None,
                      retry_in_s: float = 0.0) -> None:
        settled = await self.store.settle_notice(notice.id, self.instance_id,
                                                 outcome,
                                                 retry_in_s=retry_in_s, error=error)
        # A skipped notice (no sink, or filtered out) is every short job's: `notices` lists
        # it, so the log keeps it out of an operator's way (about a fifth of a short job's
        # log lines).
        tell = log.debug if outcome == "skipped" else log.info
        tell("notice settled", action="settle_notice", notice_id=notice.id, outcome=outcome,
             settled=settled)
