"""HTTP sessions: clients that leave without DELETE never lock the others out.

Sessions are opened with raw HTTP requests (initialize, then nothing): exactly what the MCP
Inspector CLI or the TypeScript SDK's plain `close()` leave behind.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from gateway.config import HttpConfig, load_settings
from gateway.mcp.http import build_http_app
from gateway.mcp.sessions import eviction_floor_s
from tests.mcp.conftest import TOKEN, Harness, HttpServer
from tests.mcp.test_http import INITIALIZE, MCP_HEADERS, post
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDLE_TIMEOUT_S = 1.0
IDLE_WAIT_S = 20.0  # an idle timeout of 1 s fires well within this on a loaded box


@pytest.fixture
def harness(http_harness: Harness) -> Harness:
    return http_harness


def open_session(server: HttpServer) -> str:
    answer = post(server, INITIALIZE)
    assert answer.status_code == 200, answer.text
    return str(answer.headers["mcp-session-id"])


def ping(server: HttpServer, session_id: str) -> int:
    """A request on an existing session: 200/202 while it is open, 404 once it is gone."""
    with httpx2.Client(timeout=scaled(10)) as http:
        return http.post(server.url, json={"jsonrpc": "2.0", "method":
                                           "notifications/initialized"},
                         headers=dict(MCP_HEADERS, **AUTH, **{"mcp-session-id": session_id})
                         ).status_code


@contextlib.contextmanager
def open_stream(server: HttpServer, session_id: str) -> Iterator[None]:
    """Hold the session's GET event stream open: the session is busy meanwhile."""
    with httpx2.Client(timeout=httpx2.Timeout(10, read=None)) as http, http.stream(
            "GET", server.url, headers={"Accept": "text/event-stream", **AUTH,
                                        "mcp-session-id": session_id}) as stream:
        assert stream.status_code == 200
        yield


# An idle timeout of 6 s puts the eviction floor at 3 s: long enough to tell a young session
# from an abandoned one, short enough for a test to wait it out, and 3 s of window before
# the idle timeout closes the session by itself.
EVICT_IDLE_TIMEOUT_S = 6.0
EVICT_FLOOR_S = eviction_floor_s(EVICT_IDLE_TIMEOUT_S)


# What a client adds to the Retry-After it was given: a scheduler's slack, no more.
RETRY_MARGIN_S = 0.25


async def past_the_eviction_floor() -> None:
    """Let every session that is idle now become evictable (the floor is a fixed duration)."""
    await anyio.sleep(EVICT_FLOOR_S + 0.2)


async def test_abandoned_sessions_are_evicted_lru_when_max_sessions_is_reached(
        harness: Harness) -> None:
    server = harness.http_server({"http": {"max_sessions": 2,
                                           "session_idle_timeout_s": EVICT_IDLE_TIMEOUT_S}})
    first, second = open_session(server), open_session(server)
    await past_the_eviction_floor()
    assert ping(server, first) in (200, 202)  # first is now the most recently used
    third = open_session(server)  # the cap: second, the least recently used idle, makes room
    assert ping(server, second) == 404
    assert ping(server, first) in (200, 202)
    assert ping(server, third) in (200, 202)


async def test_eviction_only_when_a_session_is_created(harness: Harness) -> None:
    """#23 item 8: at the cap, a POST that never becomes a session (`{}`, a notification,
    a request without `initialize`, a nesting bomb) evicts nothing, even sessions idle past
    the floor; the next `initialize` does."""
    server = harness.http_server({"http": {"max_sessions": 2,
                                           "session_idle_timeout_s": EVICT_IDLE_TIMEOUT_S}})
    first, second = open_session(server), open_session(server)
    await past_the_eviction_floor()
    for body in ({}, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                 {"jsonrpc": "2.0", "method": "tools/list", "id": 3}, b"[" * 50_000):
        answer = post(server, body)
        assert answer.status_code >= 400, answer.text
    assert ping(server, first) in (200, 202)
    assert ping(server, second) in (200, 202)


async def test_eviction_never_takes_a_session_younger_than_the_floor(
        harness: Harness) -> None:
    """#23 item 8: an `initialize` at the cap never evicts a session idle for less than the
    eviction floor (10 s at the default idle timeout): it is refused with 429 instead."""
    server = harness.http_server({"http": {"max_sessions": 2}})
    first, second = open_session(server), open_session(server)
    refused = post(server, INITIALIZE)
    assert refused.status_code == 429, refused.text
    assert ping(server, first) in (200, 202)
    assert ping(server, second) in (200, 202)


async def test_retry_after_says_when_the_least_recently_used_session_gives_way(
        harness: Harness) -> None:
    """#38 item 8: at the default floor (10 s) a refused client was told `Retry-After: 5`
    and refused again when it came back as told. Waiting what it says now gets in."""
    server = harness.http_server({"http": {"max_sessions": 2}})
    floor_s = eviction_floor_s(HttpConfig().session_idle_timeout_s)
    first = open_session(server)
    first_answered = time.monotonic()  # the server stamped `first` before this
    second = open_session(server)
    refusing = time.monotonic()  # ... and counted its time left after this
    refused = post(server, INITIALIZE)
    assert refused.status_code == 429, refused.text
    retry_after = int(refused.headers["retry-after"])
    # Never less than the time `first` really has left to the floor, never more than it.
    assert first_answered + floor_s - refusing <= retry_after <= math.ceil(floor_s)
    assert refused.json()["retry_after_s"] == retry_after
    await anyio.sleep(retry_after + RETRY_MARGIN_S)
    assert post(server, INITIALIZE).status_code == 200
    assert ping(server, first) == 404  # the least recently used made room
    assert ping(server, second) in (200, 202)


async def test_retry_after_only_when_every_session_is_busy(harness: Harness) -> None:
    server = harness.http_server({"http": {"max_sessions": 2,
                                           "session_idle_timeout_s": EVICT_IDLE_TIMEOUT_S}})
    first, second = open_session(server), open_session(server)
    with open_stream(server, first):
        with open_stream(server, second):
            refused = post(server, INITIALIZE)
            assert refused.status_code == 429
            # A busy session gives way no sooner than the floor after its request ends.
            assert int(refused.headers["retry-after"]) >= EVICT_FLOOR_S
            assert refused.json()["retryable"] is True
        # second's stream closed: once idle past the floor it gives way; first is untouched.
        await past_the_eviction_floor()
        assert post(server, INITIALIZE).status_code == 200
        assert ping(server, second) == 404
        assert ping(server, first) in (200, 202)


async def test_session_idle_timeout_closes_an_abandoned_session(harness: Harness) -> None:
    server = harness.http_server({"http": {"session_idle_timeout_s": IDLE_TIMEOUT_S}})
    session_id = open_session(server)
    deadline = time.monotonic() + IDLE_WAIT_S
    # Each ping is a request that restarts the idle clock: look less often than it runs.
    while True:
        await anyio.sleep(IDLE_TIMEOUT_S * 1.5)
        if ping(server, session_id) == 404:
            break
        assert time.monotonic() < deadline, "the idle session was never closed"


def test_the_sdk_session_registry_the_eviction_relies_on_still_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gateway/mcp/sessions.py uses two private names of the SDK; a rename fails here first."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    settings = load_settings(persistence={"path": str(tmp_path / "jobs.db")})
    _app, server = build_http_app(settings, "127.0.0.1", "t")
    manager = server.session_manager
    assert isinstance(manager, StreamableHTTPSessionManager)
    assert isinstance(manager._server_instances, dict)
    assert inspect.iscoroutinefunction(manager._discard_session)
    assert list(inspect.signature(manager._discard_session).parameters) == [
        "session_id", "transport"]
