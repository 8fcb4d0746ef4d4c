"""The one home of waiting in the tests: every wait is on a condition, bounded by a deadline
that grows with the machine's load (one knob).

Why: a deadline only guards a hang; when things work it is never reached. On a loaded 2-core
box (the suite beside ten CPU-bound loops, load 8-23) the same work takes many times longer, and
a bound sized for a quiet box fails a correct test. So every bound is written for a quiet box and
scaled here: by GATEWAY_TEST_TIME_SCALE when it is set (a number, at least 1), else by the
load per core at the moment the wait starts (never below 1, capped so a hang still ends).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import anyio

SCALE_ENV = "GATEWAY_TEST_TIME_SCALE"  # not AGENT_GATEWAY_*: the gateway (and clean_home) own that prefix
MAX_DERIVED_SCALE = 12.0  # a hang on a box at load 24 per core still ends within 12x the bound
POLL_S = 0.02  # how often a condition is looked at; conditions here are cheap reads


def time_scale() -> float:
    """How much longer than on a quiet box a wait may take now: the knob when set, else the
    one-minute load per core (read at each call: the load changes during a run)."""
    knob = os.environ.get(SCALE_ENV, "").strip()
    if knob:
        try:
            value = float(knob)
        except ValueError:
            raise RuntimeError(f"{SCALE_ENV}={knob!r} is not a number (e.g. 1, 2.5, 10)") from None
        return max(1.0, value)
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: a quiet box's bounds
        return 1.0
    return min(MAX_DERIVED_SCALE, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """A bound written for a quiet box, stretched for the box as it is now."""
    return seconds * time_scale()


def wait_until(condition: Callable[[], Any], what: str = "the condition", timeout: float = 10.0,
               poll: float = POLL_S) -> Any:
    """Poll a condition (in a thread or a plain test) until it is truthy and return its value;
    fail naming `what` after `timeout` quiet-box seconds, scaled."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} ({scaled(timeout):.0f} s)")
        time.sleep(poll)


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, step: float = POLL_S) -> Any:
    """Poll a (sync or async) condition until it is truthy and return its value, bounded by
    `timeout` quiet-box seconds, scaled (a TimeoutError names nothing: the caller's line does)."""
    with anyio.fail_after(scaled(timeout)):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await anyio.sleep(step)
