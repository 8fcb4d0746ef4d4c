"""SQLite-only behaviour: the file on disk, its pragmas, migrations, indexes, and two OS
processes sharing one file. The rules every backend shares are in test_contract_*.py."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from gateway.config import gateway_home
from gateway.model import InstanceRow, JobRow, JobStatus, NewJob
from gateway.store.base import SCHEMA_VERSION, StoreUnavailable
from gateway.store.sqlite import sql
from gateway.store.sqlite.store import BUSY_TIMEOUT_MS, SqliteJobStore

pytestmark = pytest.mark.anyio

OWNER = "instance-a"
TTL_S = 60.0  # a lease that cannot run out during a test
LOCKED_BUSY_TIMEOUT_MS = 100  # how long a store waits on a lock the test holds forever
CANCEL_ROUNDS = 60  # cancellations landing at different points of a transaction
PROCESS_KEYS = 40  # request keys two OS processes race on
PROCESS_LIMIT_S = 60.0  # two child processes that take longer than this are hung


def new_job(key: str | None = None) -> NewJob:
    return NewJob(
        id=str(uuid.uuid4()), provider="claude", request_key=key or uuid.uuid4().hex,
        owner_instance=OWNER,
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "nested" / "jobs.db"


@pytest.fixture
async def store(db_path: Path, anyio_backend: str) -> AsyncIterator[SqliteJobStore]:
    opened = SqliteJobStore(db_path)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """umask 0: any mode a naive implementation leaves to the umask shows up as 0644/0755."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=5)


# -- the file on disk ---------------------------------------------------------------------

async def test_database_file_and_its_wal_are_owner_only_in_owner_only_directories(
    db_path: Path, permissive_umask: None
) -> None:
    store = SqliteJobStore(db_path)
    await store.open()
    try:
        await store.insert_job(new_job(), TTL_S)  # makes SQLite create -wal and -shm
        assert mode_of(db_path) == 0o600
        assert mode_of(db_path.parent) == 0o700
        assert mode_of(db_path.parent.parent) == 0o700
        for suffix in ("-wal", "-shm"):
            side = db_path.with_name(db_path.name + suffix)
            assert side.exists(), suffix
            assert mode_of(side) == 0o600, suffix
    finally:
        await store.close()


async def test_an_existing_database_file_with_loose_permissions_is_tightened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    path.touch()
    path.chmod(0o644)
    store = SqliteJobStore(path)
    await store.open()
    await store.close()
    assert mode_of(path) == 0o600


async def test_a_directory_the_user_chose_keeps_its_own_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    store = SqliteJobStore(shared / "jobs.db")
    await store.open()
    await store.close()
    assert mode_of(shared) == 0o755
    assert mode_of(shared / "jobs.db") == 0o600


async def test_the_gateway_home_directory_is_tightened_to_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    home = gateway_home()
    home.mkdir()
    home.chmod(0o755)
    store = SqliteJobStore(home / "jobs.db")
    await store.open()
    await store.close()
    assert home.parent == tmp_path
    assert mode_of(home) == 0o700


async def test_connection_uses_wal_normal_sync_and_a_busy_timeout(
    store: SqliteJobStore, db_path: Path
) -> None:
    conn = store._connection()
    assert next(iter(await conn.execute_fetchall("PRAGMA journal_mode")))[0] == "wal"
    assert next(iter(await conn.execute_fetchall("PRAGMA synchronous")))[0] == 1  # NORMAL
    assert next(iter(await conn.execute_fetchall("PRAGMA busy_timeout")))[0] == BUSY_TIMEOUT_MS
    other = raw(db_path)
    try:  # WAL is a property of the file: every other connection sees it too
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        other.close()


async def test_reopening_the_file_keeps_jobs_and_instances(db_path: Path) -> None:
    first = SqliteJobStore(db_path)
    await first.open()
    job = await first.insert_job(new_job(), TTL_S)
    assert await first.mark_running(job.id, OWNER, TTL_S)
    await first.register_instance(
        InstanceRow(OWNER, "host", "boot", 1, 2.5, "stdio", "0.1.0"), TTL_S
    )
    row = await first.get_job(job.id)
    instances = await first.list_instances()
    await first.close()

    second = SqliteJobStore(db_path)
    await second.open()
    try:
        assert await second.get_job(job.id) == row
        assert await second.list_instances() == instances
        assert await second.schema_version() == SCHEMA_VERSION
    finally:
        await second.close()


# -- schema and migrations ----------------------------------------------------------------

async def test_tables_have_exactly_the_columns_of_the_design(
    store: SqliteJobStore, db_path: Path
) -> None:
    conn = raw(db_path)
    try:
        jobs = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
        instances = [r[1] for r in conn.execute("PRAGMA table_info(gateway_instances)")]
    finally:
        conn.close()
    # Same names as the row types (the table keeps the documented column order, the dataclass its own).
    assert sorted(jobs) == sorted(JobRow.column_names())
    assert len(jobs) == len(set(jobs))
    assert sorted(instances) == sorted(InstanceRow.__dataclass_fields__)


async def test_migrations_run_once_and_reopening_is_a_no_op(db_path: Path) -> None:
    for _ in range(3):
        store = SqliteJobStore(db_path)
        await store.open()
        await store.close()
    conn = raw(db_path)
    try:
        versions = conn.execute("SELECT version FROM schema_version").fetchall()
        assert versions == [(version,) for version, _ in sql.MIGRATIONS]
        assert versions[-1] == (SCHEMA_VERSION,)
        # Re-running every version's statements in order changes nothing.
        for _, statements in sql.MIGRATIONS:
            for statement in statements:
                conn.execute(statement)
    finally:
        conn.close()


async def test_output_is_the_last_column_so_a_large_output_is_written_in_place(
    store: SqliteJobStore, db_path: Path
) -> None:
    # Only a zero blob in the row's last column is written without building the whole row
    # in memory (see _SCHEMA_V2): a column added after `output` needs the table rebuilt.
    conn = raw(db_path)
    try:
        assert [r[1] for r in conn.execute("PRAGMA table_info(jobs)")][-1] == "output"
    finally:
        conn.close()


async def test_a_version_1_file_is_rebuilt_with_its_rows_and_indexes(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    conn = raw(db_path)
    try:
        for statement in (sql.CREATE_SCHEMA_VERSION_TABLE, *sql._SCHEMA_V1):
            conn.execute(statement)
        conn.execute(sql.RECORD_SCHEMA_VERSION, (1, 0.0))
        conn.execute(
            "INSERT INTO jobs (id, provider, status, request_key, created_at, updated_at, "
            "finished_at, output, output_bytes, result_json, boot_id) VALUES "
            "('old', 'claude', 'completed', 'k', 1.0, 2.0, 2.0, 'héllo old output', 17, "
            "'{\"text_span\":[1,5]}', 'boot')")
        indexes = sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))
    finally:
        conn.close()
    store = SqliteJobStore(db_path)
    await store.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        row = await store.get_job("old")
        assert row is not None and row.status == JobStatus.COMPLETED
        assert (row.output, row.output_bytes, row.boot_id) == ("héllo old output", 17, "boot")
        # A row written as TEXT by a v1 gateway pages like one written in place.
        data = "héllo old output".encode()
        assert await store.read_output("old", 0, 100) == (data, len(data))
        assert await store.read_output("old", 0, 100, answer=True) == (data[1:5], 4)
    finally:
        await store.close()
    conn = raw(db_path)
    try:
        assert [r[1] for r in conn.execute("PRAGMA table_info(jobs)")][-1] == "output"
        assert sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
            "AND tbl_name = 'jobs'")) == indexes
        leftover = conn.execute("SELECT name FROM sqlite_master WHERE name = 'jobs_v2'")
        assert leftover.fetchall() == []
    finally:
        conn.close()


async def test_a_schema_written_by_a_newer_gateway_is_refused(db_path: Path) -> None:
    store = SqliteJobStore(db_path)
    await store.open()
    await store.close()
    conn = raw(db_path)
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (99, 0)")
    # ...by a gateway that recorded no lowest writer this one satisfies (store/compat.py).
    conn.execute("DELETE FROM schema_meta")
    conn.close()
    with pytest.raises(StoreUnavailable, match="upgrade"):
        await SqliteJobStore(db_path).open()


async def test_dedup_index_is_unique_and_covers_only_active_unforced_jobs(
    store: SqliteJobStore, db_path: Path
) -> None:
    conn = raw(db_path)
    try:
        indexes = {r[1]: r for r in conn.execute("PRAGMA index_list(jobs)")}
        _name, unique, _origin, partial = indexes["jobs_active_request_key"][1:5]
        assert (unique, partial) == (1, 1)
        ddl = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'jobs_active_request_key'"
        ).fetchone()[0]
    finally:
        conn.close()
    assert "status IN ('queued','running')" in ddl and "forced = 0" in ddl


@pytest.mark.parametrize(
    ("statement", "index"),
    [
        ("RECOVER_EXPIRED_LEASES", "jobs_status_lease_deadline"),
        ("LIST_EXPIRED_CANDIDATES", "jobs_status_lease_deadline"),
        ("LIST_CANCEL_REQUESTED", "jobs_owner_status"),
        ("FIND_REUSABLE", "jobs_request_key_created"),
        ("PURGE_TERMINAL", "jobs_status_finished"),
    ],
)
async def test_the_periodic_queries_search_an_index_instead_of_scanning_jobs(
    store: SqliteJobStore, db_path: Path, statement: str, index: str
) -> None:
    text = getattr(sql, statement)
    params = {name: None for name in re.findall(r":(\w+)", text)}
    conn = raw(db_path)
    try:
        plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {text}", params)]
    finally:
        conn.close()
    assert any(f"INDEX {index} " in step for step in plan), plan
    assert not any(step.startswith("SCAN jobs") for step in plan), plan


# -- failures become StoreUnavailable -----------------------------------------------------

async def test_a_path_under_a_regular_file_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreUnavailable):
        await SqliteJobStore(blocker / "jobs.db").open()


async def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a sqlite database at all " * 200)
    with pytest.raises(StoreUnavailable):
        await SqliteJobStore(path).open()


async def test_a_closed_store_is_unavailable(db_path: Path) -> None:
    store = SqliteJobStore(db_path)
    await store.open()
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.get_job("any")
    with pytest.raises(StoreUnavailable):
        await store.heartbeat(OWNER, TTL_S)


async def test_a_write_lock_held_past_the_busy_timeout_is_unavailable_then_recovers(
    db_path: Path,
) -> None:
    store = SqliteJobStore(db_path, busy_timeout_ms=LOCKED_BUSY_TIMEOUT_MS)
    await store.open()
    holder = raw(db_path)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.heartbeat(OWNER, TTL_S)
        with pytest.raises(StoreUnavailable):
            await store.insert_job(new_job(), TTL_S)
        holder.execute("ROLLBACK")
        row = await store.insert_job(new_job(), TTL_S)
        assert (await store.get_job(row.id)) == row
    finally:
        holder.close()
        await store.close()


# -- cancellation and other processes -----------------------------------------------------

async def test_a_caller_cancelled_mid_transaction_never_leaves_it_open(
    store: SqliteJobStore, db_path: Path
) -> None:
    job = await store.insert_job(new_job(), TTL_S)
    assert await store.mark_running(job.id, OWNER, TTL_S)
    for round_no in range(CANCEL_ROUNDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.heartbeat, OWNER, TTL_S)
            tg.start_soon(store.insert_job, new_job(), TTL_S)
            for _ in range(round_no % 12):  # land the cancel at a different await each time
                await anyio.sleep(0)
            tg.cancel_scope.cancel()
        assert not store._connection().in_transaction, f"round {round_no}"
    # Another connection can still take the write lock at once.
    other = raw(db_path)
    try:
        other.execute("PRAGMA busy_timeout = 0")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert (await store.get_job(job.id)) is not None


CHILD_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time, uuid, anyio
    from pathlib import Path
    from gateway.model import NewJob
    from gateway.store.base import DuplicateActiveJob
    from gateway.store.sqlite.store import SqliteJobStore

    db, name, go, out, keys = sys.argv[1:6]

    async def main():
        store = SqliteJobStore(db)
        await store.open()
        Path(out + ".ready").touch()
        while not os.path.exists(go):
            await anyio.sleep(0.005)
        results = []
        for i in range(int(keys)):
            job = NewJob(id=str(uuid.uuid4()), provider="claude", request_key=f"k{i}",
                         owner_instance=name)
            try:
                await store.insert_job(job, 60)
                results.append([f"k{i}", "won", job.id])
            except DuplicateActiveJob as exc:
                results.append([f"k{i}", "lost", exc.existing_id])
        await store.close()
        Path(out).write_text(json.dumps(results))

    anyio.run(main)
    """
)


@pytest.mark.slow  # starts processes
async def test_two_processes_sharing_the_file_get_exactly_one_active_job_per_key(
    store: SqliteJobStore, db_path: Path, tmp_path: Path
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD_SCRIPT)
    go = tmp_path / "go"
    outs = [tmp_path / f"out-{n}.json" for n in range(2)]
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo_root)}

    async def child(n: int) -> None:
        await anyio.run_process(
            [sys.executable, str(script), str(db_path), f"proc-{n}", str(go), str(outs[n]),
             str(PROCESS_KEYS)],
            env=env, check=True,
        )

    with anyio.fail_after(PROCESS_LIMIT_S):
        async with anyio.create_task_group() as tg:
            for n in range(2):
                tg.start_soon(child, n)
            # Both children hold an open store before either inserts: a real race.
            while not all(Path(str(out) + ".ready").exists() for out in outs):
                await anyio.sleep(0.01)
            go.touch()

    results = [json.loads(out.read_text()) for out in outs]
    for i in range(PROCESS_KEYS):
        a, b = results[0][i], results[1][i]
        outcomes = sorted([a[1], b[1]])
        assert outcomes == ["lost", "won"], (a, b)
        winner = a if a[1] == "won" else b
        loser = b if winner is a else a
        assert loser[2] == winner[2]  # the loser was told which job won
    active = await store.list_jobs(statuses=[JobStatus.QUEUED], limit=10 * PROCESS_KEYS)
    assert len(active) == PROCESS_KEYS
    assert len({row.request_key for row in active}) == PROCESS_KEYS


async def test_regression_concurrent_openers_of_a_fresh_file_never_get_database_is_locked(
    tmp_path: Path,
) -> None:
    """Switching to WAL needs an exclusive lock and SQLite refused it at once ("database is
    locked") when several gateways opened a new file together; the switch is now retried."""
    for round_ in range(20):
        path = tmp_path / f"round-{round_}" / "jobs.db"
        stores = [SqliteJobStore(path) for _ in range(8)]
        try:
            async with anyio.create_task_group() as tg:
                for store in stores:
                    tg.start_soon(store.open)
        finally:
            for store in stores:
                await store.close()
