"""Exponential backoff: the one rule for how long a retry loop waits between attempts.

Every loop that retries a call that may pass by itself (a locked SQLite file, a full
PostgreSQL server, a store that is down, a git lock, a model API's 429) declares a
`Backoff` at its module top with its reason, and asks it for each wait, instead of keeping
its own `delay = min(delay * 2, ...)` (as procrastinate's RetryStrategy does for jobs). The
loops still decide for themselves when to give up (a deadline, an attempt count, shutdown):
that differs by loop; how the wait grows does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

# Past this many failures the delay is max_s anyway (2**63 times any sensible first_s is
# beyond any cap); it keeps 2.0 ** n from overflowing in a loop that retries for days.
_MAX_DOUBLINGS = 63


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits that start at `first_s`, double after each failure, and stop growing at `max_s`.

    `jitter` spreads clients that failed together: a wait is drawn from
    [1 - jitter, 1] x the delay (0: every wait is exactly the delay).
    """

    first_s: float
    max_s: float = math.inf
    jitter: float = 0.0

    def delay(self, failures: int) -> float:
        """The full delay after `failures` failures in a row (1 for the first)."""
        doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
        return min(self.max_s, self.first_s * 2.0 ** doublings)

    def jittered(self, delay: float) -> float:
        """`delay` shortened by a random part of up to `jitter` of itself."""
        return delay * (1 - self.jitter * random.random()) if self.jitter else delay

    def wait(self, failures: int) -> float:
        """How long to wait after `failures` failures in a row: the delay, jittered."""
        return self.jittered(self.delay(failures))

    def waits(self) -> Iterator[float]:
        """The wait after each failure of a loop, in order, for as long as it retries."""
        return (self.wait(failures) for failures in itertools.count(1))


async def woken_or_after(wake: asyncio.Event, seconds: float) -> None:
    """Return when `wake` is set or after `seconds`, whichever comes first (the caller
    clears it). asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that comes
    as the event is set, and a loop stopped at that moment never ended."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()
