"""gateway.backoff: the one rule for how a retry loop's waits grow."""

from __future__ import annotations

import itertools
import math

import pytest

from gateway.backoff import Backoff
from gateway.config import NotifyConfig
from gateway.jobs.drive import TERMINAL_WRITE_RETRY
from gateway.jobs.manager import ADOPT_RETRY
from gateway.jobs.notify.deliver import RETRY as NOTICE_RETRY
from gateway.store.postgres.pool import BUSY_RETRY
from gateway.store.sqlite.store import WAL_RETRY

SAMPLES = 200  # jittered waits drawn per check


def test_the_delay_doubles_after_each_failure_and_stops_at_the_cap() -> None:
    backoff = Backoff(first_s=0.5, max_s=5.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_without_jitter_each_wait_is_exactly_the_delay_in_order() -> None:
    backoff = Backoff(first_s=0.2, max_s=5.0)
    assert list(itertools.islice(backoff.waits(), 7)) == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_a_jittered_wait_stays_between_the_jitter_floor_and_the_delay() -> None:
    backoff = Backoff(first_s=1.0, max_s=8.0, jitter=0.5)
    for failures in (1, 3, 10):
        delay = backoff.delay(failures)
        waits = [backoff.wait(failures) for _ in range(SAMPLES)]
        assert all(0.5 * delay <= w <= delay for w in waits)
        assert len(set(waits)) > 1  # spread out, not one value


def test_a_loop_that_retries_for_days_never_overflows() -> None:
    assert Backoff(first_s=0.5, max_s=5.0).delay(100_000) == 5.0
    assert math.isfinite(Backoff(first_s=0.25).delay(100_000))


@pytest.mark.parametrize(("backoff", "first", "cap"), [
    (WAL_RETRY, 0.01, 0.2), (BUSY_RETRY, 0.05, 2.0), (ADOPT_RETRY, 0.5, 5.0),
    (TERMINAL_WRITE_RETRY, 0.2, 5.0),
])
def test_each_retry_loop_keeps_the_cadence_it_had(backoff: Backoff, first: float,
                                                  cap: float) -> None:
    assert backoff.delay(1) == first
    assert backoff.delay(2) == 2 * first
    assert backoff.delay(1000) == cap


def test_a_notice_outlasts_a_webhook_down_for_a_minute_at_the_default_max_attempts() -> None:
    """#40: a webhook down for 60 s loses nothing. With `[notify] max_attempts` at its
    default, the last attempt comes later than 60 s after the first even when every wait is
    jittered to its shortest, so a notice is tried again after the webhook is back."""
    attempts = NotifyConfig().max_attempts
    shortest = sum(NOTICE_RETRY.delay(failures) * (1 - NOTICE_RETRY.jitter)
                   for failures in range(1, attempts))
    assert shortest > 60.0, (attempts, shortest)
