"""The one wait helper's knob: GATEWAY_TEST_TIME_SCALE, else the load per core."""

from __future__ import annotations

import os

import pytest

from tests import waiting


def test_the_knob_sets_the_scale_and_never_shrinks_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "3")
    assert waiting.scaled(10) == 30
    monkeypatch.setenv(waiting.SCALE_ENV, "0.1")
    assert waiting.scaled(10) == 10


def test_a_knob_that_is_not_a_number_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "fast")
    with pytest.raises(RuntimeError, match="GATEWAY_TEST_TIME_SCALE='fast' is not a number"):
        waiting.time_scale()


def test_without_the_knob_the_load_per_core_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(waiting.SCALE_ENV, raising=False)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0 * cores, 0.0, 0.0))
    assert waiting.time_scale() == 8.0
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert waiting.time_scale() == 1.0
    monkeypatch.setattr(os, "getloadavg", lambda: (1000.0 * cores, 0.0, 0.0))
    assert waiting.time_scale() == waiting.MAX_DERIVED_SCALE


def test_a_wait_returns_the_conditions_value_or_names_what_it_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "1")
    calls = iter([0, 0, "there"])
    assert waiting.wait_until(lambda: next(calls), "a value", timeout=5, poll=0) == "there"
    with pytest.raises(AssertionError, match="timed out waiting for nothing"):
        waiting.wait_until(lambda: False, "nothing", timeout=0.05, poll=0.01)


@pytest.mark.anyio
async def test_the_async_wait_takes_sync_and_async_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "1")

    async def later() -> int:
        return 7

    assert await waiting.wait_for(lambda: 5) == 5
    assert await waiting.wait_for(later) == 7
    with pytest.raises(TimeoutError):
        await waiting.wait_for(lambda: None, timeout=0.05, step=0.01)
