"""Every private name of aiosqlite the gateway uses, behind one function.

aiosqlite runs each call on one thread per connection, but has no public call to run a
function of ours there: we need one for incremental blob I/O (which aiosqlite does not wrap)
and to run a whole write transaction in one hand-off instead of one per statement (bench/
README.md, async admission). Its own methods do it with `Connection._execute(fn)` on the
wrapped `Connection._conn`; so does `on_connection_thread`, and nothing else in the gateway
names either. pyproject pins aiosqlite to the minor release these names were checked on,
and tests/store/test_aiosqlite_fence.py asserts each exists and behaves as used, so an
upgrade that changes them fails there, by name, first (tests/test_packaging.py holds
the pin).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiosqlite

T = TypeVar("T")

# The private names, for the fence's test: what it asserts exists on a Connection.
PRIVATE_NAMES = ("_execute", "_conn")


async def on_connection_thread(conn: aiosqlite.Connection,
                               work: Callable[[sqlite3.Connection], T]) -> T:
    """Run `work` with the sqlite3 connection on aiosqlite's thread, the one thread that may
    use it; a call made inside a transaction stays inside it (same connection, same thread).
    Raises what `work` raised."""
    run_on_thread: Callable[[Callable[[], T]], Awaitable[T]] = conn._execute
    return await run_on_thread(lambda: work(conn._conn))
