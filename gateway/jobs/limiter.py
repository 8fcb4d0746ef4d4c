"""Per-process admission limiter: global and per-provider running caps, one FIFO queue.

A provider at its cap never blocks another provider's queued job (no head-of-line
blocking across providers), while the order within one provider is kept. Permits are
released exactly once: `Ticket.release` is idempotent and the job driver calls it only when
the process group is really gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from dataclasses import dataclass, field

from gateway.model import ErrorKind, GatewayError


@dataclass(eq=False)
class Ticket:
    """A claim on one run slot: granted now, or waiting in the FIFO queue."""

    provider: str
    _limiter: Limiter
    _granted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    _released: bool = False

    @property
    def granted(self) -> bool:
        return self._granted.done() and not self._granted.cancelled()

    async def wait(self) -> None:
        """Until the slot is granted (the caller bounds it with the queue timeout)."""
        await asyncio.shield(self._granted)

    def release(self) -> None:
        """Give the slot back (or leave the queue). Idempotent: exactly-once by construction."""
        if self._released:
            return
        self._released = True
        self._limiter._on_release(self)


class Limiter:
    def __init__(self, max_running: int, max_per_provider: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_per_provider = max_per_provider
        self.max_queued = max_queued
        self._running: Counter[str] = Counter()
        self._queue: deque[Ticket] = deque()
        self._place_waiters: list[asyncio.Future[None]] = []  # wait_for_place
        self.rejected = 0

    @property
    def running_total(self) -> int:
        return sum(self._running.values())

    def full_limit(self, provider: str) -> str:
        """The limit that keeps `provider`'s queued jobs waiting now, named as the config
        key a user would raise (the global one when both are reached)."""
        if self.running_total >= self.max_running:
            return (f"limits.max_running_jobs ({self.max_running} running on this gateway, "
                    f"all providers)")
        return (f"limits.max_running_per_provider ({self.max_per_provider} {provider} jobs "
                f"running)")

    def _has_room(self, provider: str) -> bool:
        return (
            self.running_total < self.max_running
            and self._running[provider] < self.max_per_provider
        )

    def would_refuse(self, provider: str) -> bool:
        """Whether acquire(provider) would raise SATURATED now."""
        if self._has_room(provider) and not any(t.provider == provider for t in self._queue):
            return False
        return len(self._queue) >= self.max_queued

    async def wait_for_place(self, provider: str, timeout_s: float) -> None:
        """Until acquire(provider) would not be refused, or `timeout_s` passed (then it
        will be). A full queue makes a new request wait for the next place a finished run
        frees instead of failing at once: a burst of calls is paced by the drain rather than
        refused, as long as something finishes within the bound. Holds nothing while it
        waits; a caller that gives up leaves nothing behind."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.would_refuse(provider):
                    place: asyncio.Future[None] = loop.create_future()
                    self._place_waiters.append(place)
                    try:
                        await place
                    finally:
                        self._place_waiters.remove(place)

    def acquire(self, provider: str) -> Ticket:
        """A ticket granted at once when there is room, else queued.

        Raises GatewayError(SATURATED) at once when the queue is full (nothing is held).
        """
        ticket = Ticket(provider, self)
        # Queue order is respected for this provider: a new request never overtakes an
        # older queued one of the same provider.
        if self._has_room(provider) and not any(t.provider == provider for t in self._queue):
            self._grant(ticket)
            return ticket
        if len(self._queue) >= self.max_queued:
            self.rejected += 1
            raise GatewayError(
                ErrorKind.SATURATED,
                f"Gateway is at capacity for {provider}: running limit ({self.max_running} "
                f"global / {self.max_per_provider} per provider) reached and the queue is full "
                f"(max {self.max_queued}), and no place freed while this request waited "
                f"(limits.queue_full_wait_s). This is transient: retry after a short delay, "
                f"or send fewer concurrent requests.",
            )
        self._queue.append(ticket)
        return ticket

    def acquire_running(self, provider: str) -> Ticket:
        """A ticket granted at once, even past the limits: for a run that is already going
        (adopted from a gone gateway). It counts toward the limits like any other, so new
        work waits until there is room again."""
        ticket = Ticket(provider, self)
        self._grant(ticket)
        return ticket

    def _grant(self, ticket: Ticket) -> None:
        self._running[ticket.provider] += 1
        ticket._granted.set_result(None)

    def _on_release(self, ticket: Ticket) -> None:
        if ticket.granted:
            self._running[ticket.provider] -= 1
        else:
            # Never granted: it leaves the queue (cancelled or timed out while waiting).
            with contextlib.suppress(ValueError):
                self._queue.remove(ticket)
            if not ticket._granted.done():
                ticket._granted.cancel()
        self._pump()
        for place in self._place_waiters:  # each looks again; the first to act takes it
            if not place.done():
                place.set_result(None)

    def _pump(self) -> None:
        """Grant, in FIFO order, every queued ticket whose provider now has room."""
        progressed = True
        while progressed and self._queue:
            progressed = False
            for ticket in list(self._queue):
                if self.running_total >= self.max_running:
                    return
                if self._running[ticket.provider] < self.max_per_provider:
                    self._queue.remove(ticket)
                    self._grant(ticket)
                    progressed = True
                    break

    def position(self, ticket: Ticket) -> int | None:
        """1-based place of a waiting ticket in the queue; None once granted or gone."""
        for index, queued in enumerate(self._queue, start=1):
            if queued is ticket:
                return index
        return None

    def snapshot(self) -> dict[str, object]:
        queued: Counter[str] = Counter(t.provider for t in self._queue)
        return {
            "max_running_jobs": self.max_running,
            "max_running_per_provider": self.max_per_provider,
            "max_queued_jobs": self.max_queued,
            "running": self.running_total,
            "queued": len(self._queue),
            "running_by_provider": {k: v for k, v in self._running.items() if v},
            "queued_by_provider": dict(queued),
            "rejected": self.rejected,
        }
