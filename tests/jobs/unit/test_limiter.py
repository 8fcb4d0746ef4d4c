"""The limiter: caps, FIFO, no cross-provider head-of-line blocking, exactly-once release."""

from __future__ import annotations

import asyncio

import pytest

from gateway.jobs.limiter import Limiter
from gateway.model import ErrorKind, GatewayError

pytestmark = pytest.mark.anyio


async def test_grants_up_to_the_global_cap_then_queues() -> None:
    limiter = Limiter(max_running=2, max_per_provider=5, max_queued=5)
    a, b, c = (limiter.acquire("claude") for _ in range(3))
    assert a.granted and b.granted and not c.granted
    a.release()
    assert c.granted
    assert limiter.snapshot()["running"] == 2


async def test_full_queue_is_saturated_at_once_and_holds_nothing() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=1)
    limiter.acquire("claude")
    limiter.acquire("claude")
    with pytest.raises(GatewayError) as err:
        limiter.acquire("claude")
    assert err.value.kind == ErrorKind.SATURATED and err.value.retryable
    assert limiter.snapshot()["queued"] == 1 and limiter.snapshot()["rejected"] == 1


async def test_a_wait_for_a_place_ends_when_a_release_frees_one() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=1)
    running = limiter.acquire("claude")
    limiter.acquire("claude")  # the queue's one place
    assert limiter.would_refuse("claude")
    waiter = asyncio.create_task(limiter.wait_for_place("claude", 600))
    await asyncio.sleep(0)
    assert not waiter.done()
    running.release()  # the queued one runs: its place is free
    await asyncio.wait_for(waiter, 30)
    assert not limiter.would_refuse("claude")
    assert limiter.acquire("claude") is not None and limiter.snapshot()["rejected"] == 0


async def test_a_wait_for_a_place_gives_up_at_its_bound_holding_nothing() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=0)
    limiter.acquire("claude")
    await limiter.wait_for_place("claude", 0.01)  # nothing frees one
    with pytest.raises(GatewayError) as err:
        limiter.acquire("claude")
    assert err.value.kind == ErrorKind.SATURATED
    assert "limits.queue_full_wait_s" in err.value.message
    assert limiter.snapshot()["queued"] == 0 and not limiter._place_waiters


async def test_queue_is_fifo_within_a_provider() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=10)
    first = limiter.acquire("codex")
    waiting = [limiter.acquire("codex") for _ in range(4)]
    order = []
    holder = first
    for _ in waiting:
        holder.release()
        now = [t for t in waiting if t.granted and t not in order]
        assert len(now) == 1
        order.append(now[0])
        holder = now[0]
    assert order == waiting


async def test_a_provider_at_its_cap_never_blocks_another_providers_queued_job() -> None:
    limiter = Limiter(max_running=10, max_per_provider=1, max_queued=10)
    limiter.acquire("claude")
    blocked = limiter.acquire("claude")  # claude at its cap: queued
    other = limiter.acquire("codex")  # behind it in the queue, but codex has room
    assert not blocked.granted
    assert other.granted


async def test_release_is_exactly_once() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=10)
    a = limiter.acquire("gemini")
    b = limiter.acquire("gemini")
    c = limiter.acquire("gemini")
    a.release()
    a.release()  # a second release must not free another slot
    assert b.granted and not c.granted
    assert limiter.snapshot()["running"] == 1


async def test_releasing_a_queued_ticket_leaves_the_queue_without_freeing_a_slot() -> None:
    limiter = Limiter(max_running=1, max_per_provider=1, max_queued=10)
    a = limiter.acquire("grok")
    b = limiter.acquire("grok")
    c = limiter.acquire("grok")
    b.release()  # cancelled while queued
    assert limiter.snapshot()["queued"] == 1 and not c.granted
    a.release()
    assert c.granted and not b.granted
