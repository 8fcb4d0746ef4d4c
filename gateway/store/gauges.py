"""Gauges that a status report shows: the worst value of the last hour.

Shared by the PostgreSQL pools (how long a call waited for a connection) and the lease
keeper (how long a renewal waited: Paperclip's `renewalPendingMs`), without either
importing the other or asyncpg.
"""

from __future__ import annotations

import time
from collections import deque

WAIT_WINDOW_S = 3600.0  # "the worst of the last hour"


class WorstOfLastHour:
    """The largest value recorded within the last `window_s` (monotonic clock): bounded
    memory, since only values that could still become the worst are kept."""

    def __init__(self, window_s: float = WAIT_WINDOW_S) -> None:
        self.window_s = window_s
        self._values: deque[tuple[float, float]] = deque()  # (when, value), values decreasing

    def record(self, value: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        while self._values and self._values[-1][1] <= value:
            self._values.pop()  # a smaller, older value can never be the worst again
        self._values.append((now, value))
        self._expire(now)

    def worst(self, now: float | None = None) -> float | None:
        self._expire(time.monotonic() if now is None else now)
        return self._values[0][1] if self._values else None

    def _expire(self, now: float) -> None:
        while self._values and self._values[0][0] < now - self.window_s:
            self._values.popleft()
