"""Which Streamable HTTP sessions are busy, and evicting the least recently used idle one.

Many clients leave without `DELETE` (the MCP Inspector CLI, `claude mcp get`, the TypeScript
SDK's plain `close()`): their sessions stay open until the idle timeout. At `max_sessions`
the SDK refuses every new client, so abandoned sessions would lock everyone out. The guard
(http.py) therefore tells this table about every request of a known session (in flight,
last used) and, before a new session is opened at the cap, closes the least recently used
session with nothing in flight. Only when every session is busy is the new client refused.

Eviction is a door for any authenticated caller, so it is kept narrow (#23 item 8): only a
request that really opens a session (a JSON-RPC `initialize`; anything else the SDK refuses
without a session) evicts, and never a session idle for less than the eviction floor
(`min(EVICTION_FLOOR_S, session_idle_timeout_s / 2)`): a client that just opened its session
and has not sent its next request yet keeps it.

The SDK offers no public way to list or close a session, so the two private names it needs
(`_server_instances`, `_discard_session`) are used here and nowhere else;
tests/mcp/test_http_sessions.py fails if the SDK renames them.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator

import structlog
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from gateway.mcp.sdk_fence import discard_session, open_session_ids, session_transport

log = structlog.get_logger(__name__)

# A session idle for less than this is never evicted (capped at half the idle timeout, so
# eviction still has a window before the idle timeout closes the session anyway).
EVICTION_FLOOR_S = 10.0


def eviction_floor_s(session_idle_timeout_s: float) -> float:
    """How long a session must have been idle before a new client may evict it."""
    return min(EVICTION_FLOOR_S, session_idle_timeout_s / 2)


def opens_a_session(body: bytes) -> bool:
    """True when a POST body without a session id is a JSON-RPC `initialize` request: the
    only one the SDK turns into a session. Anything else (`{}`, a notification, junk, a
    nesting bomb) gets its error without costing another client its session."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return (isinstance(message, dict) and message.get("method") == "initialize"
            and "id" in message)


class SessionTable:
    """In-flight counts and last-use times of the SDK's sessions, as the guard sees them."""

    def __init__(self, manager: StreamableHTTPSessionManager, *,
                 session_idle_timeout_s: float) -> None:
        self._manager = manager
        self._floor_s = eviction_floor_s(session_idle_timeout_s)
        self._in_flight: dict[str, int] = {}
        self._last_used: dict[str, float] = {}

    def open_ids(self) -> list[str]:
        """The ids of the sessions the SDK holds open."""
        return open_session_ids(self._manager)

    def opened(self, session_id: str) -> None:
        """The SDK answered an opening request with this new session id."""
        self._last_used[session_id] = time.monotonic()

    @contextlib.contextmanager
    def request(self, session_id: str) -> Iterator[None]:
        """One request (a POST, or a GET stream for as long as it is open) of a session."""
        self._in_flight[session_id] = self._in_flight.get(session_id, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight.get(session_id, 1) - 1
            if left > 0:
                self._in_flight[session_id] = left
            else:
                self._in_flight.pop(session_id, None)
            if session_transport(self._manager, session_id) is not None:
                self._last_used[session_id] = time.monotonic()
            else:  # an unknown id (404) or a session just ended: nothing to remember
                self._last_used.pop(session_id, None)

    def _idle(self, open_ids: list[str], *, within_floor: bool = False) -> list[str]:
        # A session absent from _last_used is still answering its opening request: busy.
        # One idle for less than the floor is treated as busy too, unless `within_floor`.
        now = time.monotonic()
        return [s for s in open_ids if s in self._last_used and not self._in_flight.get(s)
                and (within_floor or now - self._last_used[s] >= self._floor_s)]

    def retry_after_s(self) -> int:
        """Whole seconds until `make_room` can evict a session, for a refused client's
        Retry-After (#38 item 8: a fixed 5 s sent it back before the 10 s floor let any
        session go, to be refused again): the least recently used idle session's time left
        to the floor, rounded up, at least 1. The idle timeout is at least twice the floor,
        so it never frees a session sooner. A busy session gives way no sooner than the
        floor after its request ends, so with none idle the floor is the least to wait."""
        idle = self._idle(self.open_ids(), within_floor=True)
        if not idle:
            return max(1, math.ceil(self._floor_s))
        oldest = min(self._last_used[s] for s in idle)
        return max(1, math.ceil(oldest + self._floor_s - time.monotonic()))

    def at_cap(self, max_sessions: int) -> bool:
        """Whether a new session would need another one to make room (forgets ended ones)."""
        open_ids = self.open_ids()
        alive = set(open_ids)
        for table in (self._last_used, self._in_flight):
            for gone in [s for s in table if s not in alive]:
                del table[gone]  # ended by DELETE or the idle timeout
        return len(open_ids) >= max_sessions

    async def make_room(self, max_sessions: int) -> bool:
        """Before a new session (an `initialize`): at the cap, close the least recently used
        session idle past the floor.

        False when the cap is reached and every session is busy or too recently used (the
        caller says "retry later"). Two new clients racing for one freed slot can still see
        the SDK refuse one of them; that one gets the same retryable answer.
        """
        if not self.at_cap(max_sessions):
            return True
        open_ids = self.open_ids()
        idle = self._idle(open_ids)
        if not idle:
            return False
        victim = min(idle, key=lambda s: self._last_used[s])
        idle_for = time.monotonic() - self._last_used.pop(victim)
        transport = session_transport(self._manager, victim)
        if transport is not None:
            await discard_session(self._manager, victim, transport)
        log.info("evicted the least recently used idle HTTP session", action="session_evict",
                 idle_s=round(idle_for, 1), open_sessions=len(open_ids))
        return True
