"""The private names of aiosqlite the SQLite store relies on (gateway/store/sqlite/aiosqlite_fence.py).

One test per name, on a real connection to a real file: each asserts the name exists and
behaves as the fence uses it, so an aiosqlite release that renames or changes one fails
here, by name, instead of somewhere inside a write.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from gateway.store.sqlite.aiosqlite_fence import PRIVATE_NAMES, on_connection_thread

pytestmark = pytest.mark.anyio



@pytest.fixture
async def conn(tmp_path: Path, anyio_backend: str) -> AsyncIterator[aiosqlite.Connection]:
    opened = await aiosqlite.connect(tmp_path / "fence.db", isolation_level=None)
    try:
        yield opened
    finally:
        await opened.close()


def on_thread(conn: aiosqlite.Connection) -> Callable[[Callable[[], Any]], Awaitable[Any]]:
    """The private call under test, typed as the fence types it (aiosqlite leaves it bare)."""
    run: Callable[[Callable[[], Any]], Awaitable[Any]] = conn._execute
    return run


def test_the_fence_names_exactly_the_private_names_its_tests_cover() -> None:
    assert PRIVATE_NAMES == ("_execute", "_conn")


async def test_execute_runs_a_function_on_the_connections_one_thread(
        conn: aiosqlite.Connection) -> None:
    run_on_thread = on_thread(conn)
    first = await run_on_thread(threading.get_ident)
    second = await run_on_thread(threading.get_ident)
    assert first == second != threading.get_ident()
    assert await run_on_thread(lambda: 6 * 7) == 42


async def test_execute_raises_what_the_function_raised(conn: aiosqlite.Connection) -> None:
    def fail() -> None:
        raise LookupError("from the connection's thread")

    with pytest.raises(LookupError, match="connection's thread"):
        await on_thread(conn)(fail)


async def test_conn_is_the_wrapped_sqlite3_connection_that_aiosqlite_itself_uses(
        conn: aiosqlite.Connection) -> None:
    raw = await on_thread(conn)(lambda: conn._conn)
    assert isinstance(raw, sqlite3.Connection)
    await conn.execute("CREATE TABLE t (n INTEGER)")
    # A table aiosqlite created is seen through _conn: one connection, not a second one.
    assert await on_thread(conn)(
        lambda: raw.execute("SELECT count(*) FROM t").fetchone()[0]) == 0


async def test_on_connection_thread_stays_inside_a_transaction_aiosqlite_opened(
        conn: aiosqlite.Connection) -> None:
    await conn.execute("CREATE TABLE t (n INTEGER)")
    await conn.execute("BEGIN IMMEDIATE")
    await on_connection_thread(conn, lambda db: db.execute("INSERT INTO t VALUES (1)"))
    assert await on_connection_thread(conn, lambda db: db.in_transaction)
    await conn.execute("ROLLBACK")
    rows = await conn.execute_fetchall("SELECT n FROM t")
    assert list(rows) == []  # the insert was part of the rolled-back transaction

