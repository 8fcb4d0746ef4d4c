"""SQLite JobStore (aiosqlite): the default backend, one file shared by every gateway on a host.

All SQL of this backend is below as named module constants; each says which invariant its
WHERE clause enforces. Every write runs in `BEGIN IMMEDIATE`, so two processes sharing the
file take the write lock before they read the rows they decide on: a compare-and-set can
never act on a stale view. Within one process, one lock serializes the single connection.
Every write runs as one function on the connection's thread (`_transaction`): one hand-off
per write, not one per statement.

Times are REAL epoch seconds (the local clock is the clock: SQLite is one host); rows come
back with timezone-aware UTC datetimes. `now` is read after the write lock is held, so a
lease computed by one writer is never older than a decision taken by the next.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio
import structlog

from gateway.backoff import Backoff
from gateway.fs import ensure_private_dir, ensure_private_file
from gateway.model import (
    CANCELLED_ERROR,
    FINAL_STATUSES,
    ORPHANED_ERROR,
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    Progress,
)
from gateway.store.base import (
    PREFIX_MATCH_LIMIT,
    REAPER_BATCH_ROWS,
    RETENTION_BATCH_ROWS,
    AdoptionCandidate,
    DuplicateActiveJob,
    JobsPage,
    RemotePatch,
    StoreFull,
    StoreReplaced,
    StoreUnavailable,
    TakeOver,
    WorkerClaim,
    like_prefix,
    output_to_bind,
)
from gateway.store.sqlite import meta as sqlite_meta
from gateway.store.sqlite import sweeps as sqlite_sweeps
from gateway.store.sqlite import usage as sqlite_usage
from gateway.store.sqlite.aiosqlite_fence import on_connection_thread
from gateway.store.sqlite.rows import (
    _candidate,
    _changed,
    _epoch,
    _fetch_light,
    _instance,
    _job,
    _read_output,
    _run_transaction,
    _write_output,
    jobs_page_params,
)
from gateway.store.sqlite.sql import (
    ADOPT_JOB,
    COMPLETE_JOB,
    CREATE_SCHEMA_VERSION_TABLE,
    EXTEND_LEASES,
    FIND_ACTIVE_BY_KEY,
    FIND_JOB_IDS,
    FIND_REUSABLE,
    FIND_REUSABLE_LIGHT,
    GC_INSTANCES,
    GET_JOB,
    GET_JOB_LIGHT,
    INSERT_JOB,
    LIST_ADOPTION_CANDIDATES,
    LIST_CANCEL_REQUESTED,
    LIST_EXPIRED_CANDIDATES,
    LIST_INSTANCES,
    LIST_JOBS,
    LIST_JOBS_LIGHT,
    LIST_JOBS_PAGE,
    LIST_JOBS_PAGE_LIGHT,
    MARK_INSTANCE_STOPPED,
    MARK_RUNNING,
    MIGRATIONS,
    PUBLISH_CAPABILITIES,
    PURGE_TERMINAL,
    READ_SCHEMA_VERSION,
    RECORD_PROCESS,
    RECORD_SCHEMA_VERSION,
    RECOVER_EXPIRED_LEASES,
    RENEW_INSTANCE_LEASE,
    REQUEST_CANCEL,
    REQUEUE_JOB,
    SAVE_PROGRESS,
    UPSERT_INSTANCE,
)
from gateway.store.usage import BudgetWindow, GroupBy, UsageRow

log = structlog.get_logger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000  # another process holding the write lock gets this long before we give up
FILE_MODE = 0o600  # job rows hold prompts and outputs: owner only
# OS errors creating the file that can pass by themselves (space, descriptors, a busy or
# interrupted call); any other (no such directory, permission, read-only) is permanent.
TRANSIENT_OS_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE,
                                 errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.EIO})
# Switching to WAL while another opener holds the file: concurrent openers clear in
# milliseconds, so back off from 10 ms, never more than 0.2 s at a time.
WAL_RETRY = Backoff(first_s=0.01, max_s=0.2)


@contextmanager
def _store_errors(action: str) -> Iterator[None]:
    """Turn SQLite and OS failures into StoreUnavailable, StoreFull when the disk is full
    (integrity errors are bugs: kept)."""
    try:
        yield
    except sqlite3.IntegrityError:
        raise
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise StoreFull(f"sqlite store: {action} failed: {exc}") from exc
        raise StoreUnavailable(f"sqlite store: {action} failed: {exc}") from exc
    except OSError as exc:
        unavailable = StoreFull if exc.errno == errno.ENOSPC else StoreUnavailable
        raise unavailable(f"sqlite store: {action} failed: {exc.strerror or exc}") from exc



class SqliteJobStore:
    """JobStore on one SQLite file (WAL), safe to share between processes on one host."""

    backend = "sqlite"

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path).expanduser()
        self.busy_timeout_ms = int(busy_timeout_ms)
        # The store's clock (epoch seconds): every lease is written and judged with it. A
        # test injects one that steps, as a suspend and resume does to the wall clock.
        self.clock = clock
        self._conn: aiosqlite.Connection | None = None
        # The file's identity (st_dev, st_ino) when it was opened, and why the store stopped
        # using it if the path stopped naming that file (deleted, replaced).
        self._file_id: tuple[int, int] | None = None
        self._replaced: str | None = None
        # One connection per store: a transaction must never interleave with another task's.
        self._lock = anyio.Lock()

    # -- connection -----------------------------------------------------------------------
    async def open(self) -> None:
        """Create the file (0600) and directory (0700), set WAL, migrate the schema.

        Raises StoreUnavailable when the file cannot be created or opened, or the schema
        was written by a newer gateway.
        """
        if self._conn is not None:
            return
        try:
            ensure_private_dir(self.path.parent)
            ensure_private_file(self.path, FILE_MODE)
        except OSError as exc:
            # Named, and permanent unless it is a passing condition (disk full, too many
            # open files): a path on a virtual or read-only filesystem never becomes creatable.
            raise StoreUnavailable(
                f"sqlite store: cannot create {self.path} "
                f"({exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}); set "
                f"[persistence] path to a writable location",
                permanent=exc.errno not in TRANSIENT_OS_ERRORS) from exc
        with _store_errors("open"):
            conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            with _store_errors("open"):
                conn.row_factory = sqlite3.Row
                # busy_timeout first: switching to WAL may wait for another opener's lock.
                await conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
                await self._enable_wal(conn)
                await conn.execute("PRAGMA synchronous = NORMAL")
            self._conn = conn
            self._file_id, self._replaced = self._identity(), None
            await self._migrate()
        except BaseException:
            self._conn = None
            with anyio.CancelScope(shield=True), suppress(sqlite3.Error, ValueError):
                await conn.close()
            raise
        log.debug("sqlite store open", action="open_store", path=str(self.path))

    async def _enable_wal(self, conn: aiosqlite.Connection) -> None:
        """Switch the file to WAL, retrying while another opener holds it.

        Changing the journal mode needs an exclusive lock, and SQLite answers "database is
        locked" at once (without the busy handler) when several gateways open a fresh file
        together, as MCP clients do when they spawn one per window.
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        waits = WAL_RETRY.waits()
        while True:
            try:
                await conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                delay = next(waits)
                if time.monotonic() + delay > deadline:
                    raise
            await anyio.sleep(delay)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            async with self._lock:
                with anyio.CancelScope(shield=True), suppress(sqlite3.Error, ValueError):
                    await conn.close()

    def _connection(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise StoreUnavailable("sqlite store is not open")
        if self._replaced is not None:
            raise StoreReplaced(self._replaced, permanent=True)
        return self._conn

    def _identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return None
        return info.st_dev, info.st_ino

    def check_file(self) -> None:
        """Raise StoreReplaced if the path no longer names the file this store opened.

        A deleted file stays writable through the open connection, so without this check
        every result written from then on would vanish with the unlinked inode, and a second
        gateway would create an empty file and run an identical request again. Called on
        each heartbeat (one stat); from the first mismatch on, every call is refused.
        """
        if self._replaced is None and self._file_id is not None:
            found = self._identity()
            if found != self._file_id:
                what = "deleted" if found is None else "replaced by another file"
                self._replaced = (
                    f"sqlite store: the database file {self.path} was {what} while this "
                    f"gateway had it open; its writes would be lost, so it no longer uses "
                    f"it. Restore the file or restart the gateway (jobs it had stored are "
                    f"in the old file only).")
                log.error("the sqlite database file was deleted or replaced",
                          action="store_replaced", path=str(self.path), found=what)
        if self._replaced is not None:
            raise StoreReplaced(self._replaced, permanent=True)

    @asynccontextmanager
    async def _read(self, action: str) -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            conn = self._connection()
            with _store_errors(action):
                yield conn

    async def _transaction(self, action: str,
                           work: Callable[[sqlite3.Connection, float], T]) -> T:
        """`work(db, now)` as one IMMEDIATE transaction, run whole on the connection's thread:
        every write of this store. The write lock is held before the first read, so two
        processes on the same file serialize; rolled back on any error.

        One hand-off, not one per statement (BEGIN, each statement, COMMIT): each of those
        waits for the thread and then for the event loop, while the lock is held and
        admission queues behind it (bench/README.md, async admission).
        """
        async with self._lock:
            conn = self._connection()
            with _store_errors(action):
                # Shielded: a cancelled caller still waits for the COMMIT or ROLLBACK, so the
                # lock (and the file's write lock) is never handed on mid-transaction.
                with anyio.CancelScope(shield=True):
                    result = await on_connection_thread(
                        conn, lambda db: _run_transaction(db, self.clock, work))
        return result

    async def _migrate(self) -> None:
        def migrate(db: sqlite3.Connection, now: float) -> list[int]:
            db.execute(CREATE_SCHEMA_VERSION_TABLE)
            current = db.execute(READ_SCHEMA_VERSION).fetchone()[0]
            # Before the first write: a store this gateway may no longer write is refused.
            meta = sqlite_meta.refuse_unless_writable(db, f"sqlite store {self.path}", current)
            applied = []
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    db.execute(statement)
                db.execute(RECORD_SCHEMA_VERSION, (version, now))
                applied.append(version)
            sqlite_meta.record_migration(db, applied, meta)
            return applied

        for version in await self._transaction("migrate", migrate):
            log.info("sqlite schema migrated", action="migrate", version=version)

    async def schema_version(self) -> int:
        async with self._read("schema_version") as conn:
            (row,) = await conn.execute_fetchall(READ_SCHEMA_VERSION)
            return int(row[0])

    async def now(self) -> float:
        return self.clock()

    # -- instances -------------------------------------------------------------------------
    async def register_instance(self, instance: InstanceRow, ttl_s: float) -> None:
        params = {
            "instance_id": instance.instance_id, "hostname": instance.hostname,
            "boot_id": instance.boot_id, "pid": instance.pid,
            "pid_started_at": instance.pid_started_at, "role": instance.role,
            "version": instance.version, "started_at": _epoch(instance.started_at),
            "ttl_s": ttl_s, "capabilities": instance.capabilities,
        }
        await self._transaction("register_instance", lambda db, now: _changed(
            db, UPSERT_INSTANCE, {**params, "now": now}))

    async def mark_instance_stopped(self, instance_id: str) -> None:
        await self._transaction("mark_instance_stopped", lambda db, now: _changed(
            db, MARK_INSTANCE_STOPPED, {"instance_id": instance_id, "now": now}))

    async def heartbeat(self, instance_id: str, ttl_s: float,
                        renewal_wait_ms: float | None = None) -> int:
        self.check_file()
        return await self._transaction("heartbeat", lambda db, now: _changed(
            db, RENEW_INSTANCE_LEASE, {"instance_id": instance_id, "now": now, "ttl_s": ttl_s,
                                       "renewal_wait_ms": renewal_wait_ms}))

    async def gc_instances(self, older_than_s: float, hostname: str | None = None,
                           keep: Sequence[str] = ()) -> int:
        return await self._transaction("gc_instances", lambda db, now: _changed(
            db, GC_INSTANCES, {"now": now, "older_than_s": older_than_s,
                               "hostname": hostname, "keep": json.dumps(list(keep))}))

    async def list_instances(self) -> list[InstanceRow]:
        async with self._read("list_instances") as conn:
            return [_instance(r) for r in await conn.execute_fetchall(LIST_INSTANCES)]

    # -- admission and transitions --------------------------------------------------------
    async def find_reusable(self, request_key: str, dedup_window_s: float) -> JobRow | None:
        rows = await self._light_rows("find_reusable", FIND_REUSABLE_LIGHT, FIND_REUSABLE, {
            "request_key": request_key, "now": self.clock(), "dedup_window_s": dedup_window_s,
        })
        return rows[0] if rows else None

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        params = {
            "id": job.id, "provider": job.provider, "request_key": job.request_key,
            "transport": job.transport, "correlation_id": job.correlation_id,
            "owner_instance": job.owner_instance, "hostname": job.hostname,
            "working_dir": job.working_dir, "model": job.model,
            "session_id": job.session_id, "request_json": job.request_json,
            "forced": job.forced, "boot_id": job.boot_id, "ttl_s": ttl_s,
            "principal": job.principal, "running": job.running,
        }

        def insert(db: sqlite3.Connection, now: float) -> JobRow:
            try:
                rows = db.execute(INSERT_JOB, {**params, "now": now}).fetchall()
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"job id {job.id} already exists") from exc
            if rows:
                # Invariant: the job and its budget reservations commit together or not at
                # all (BudgetExceeded rolls the insert back): sqlite_usage.RESERVE_BUDGET.
                sqlite_usage.reserve(db, job.id, job.reservations, now)
                return _job(rows[0])
            # The winner of the race, read in the same transaction (rolled back: no change).
            existing = db.execute(FIND_ACTIVE_BY_KEY, {"request_key": job.request_key}).fetchall()
            raise DuplicateActiveJob(existing[0][0] if existing else None)

        return await self._transaction("insert_job", insert)

    async def mark_running(self, job_id: str, owner_instance: str, ttl_s: float) -> bool:
        params = {"job_id": job_id, "owner_instance": owner_instance, "ttl_s": ttl_s}
        return await self._transaction(
            "mark_running", lambda db, now: _changed(db, MARK_RUNNING, {**params, "now": now})) == 1

    async def record_process(
        self, job_id: str, owner_instance: str, pid: int, pgid: int, pid_started_at: float
    ) -> bool:
        params = {"job_id": job_id, "owner_instance": owner_instance, "pid": pid, "pgid": pgid,
                  "pid_started_at": pid_started_at}
        return await self._transaction(
            "record_process", lambda db, now: _changed(db, RECORD_PROCESS, {**params, "now": now})) == 1

    async def complete(self, job_id: str, owner_instance: str,
                       completion: Completion) -> JobRow | None:
        if completion.status not in FINAL_STATUSES:
            raise ValueError(f"a completion cannot be {completion.status!s}")
        output, pieces = output_to_bind(completion.output)
        params = {
            "job_id": job_id, "owner_instance": owner_instance,
            "status": completion.status.value, "exit_code": completion.exit_code,
            "error": completion.error, "error_kind": completion.error_kind,
            "output": output, "reserve": pieces.size if pieces else None,
            "stderr_tail": completion.stderr_tail,
            "output_bytes": completion.output_bytes, "truncated": completion.truncated,
            "result_json": completion.result_json, "cancelled_error": CANCELLED_ERROR,
            "ended_at": completion.ended_at,
        }

        def complete(db: sqlite3.Connection, now: float) -> JobRow | None:
            applied = _changed(db, COMPLETE_JOB, {**params, "now": now}) == 1
            if applied:  # counted and settled once: with the write that ends the job
                sqlite_usage.account(db, job_id, completion.usage, now)
            if applied and pieces is not None:
                # Invariant: the CAS above and the output's bytes commit in one IMMEDIATE
                # transaction, so a reader (any process) sees the row active, or terminal
                # with its whole output; a failure here rolls both back. A write that lost
                # the CAS touches nothing.
                _write_output(db, job_id, pieces)
            if not applied:
                return None
            rows = _fetch_light(db, GET_JOB_LIGHT, GET_JOB, {"job_id": job_id})
            return rows[0] if rows else None

        return await self._transaction("complete", complete)

    async def request_cancel(self, job_id: str) -> JobRow | None:
        params = {"job_id": job_id}

        def cancel(db: sqlite3.Connection, now: float) -> JobRow | None:
            db.execute(REQUEST_CANCEL, {**params, "now": now})
            # The row as this write left it (same transaction), light: a finished job's
            # output is not needed to answer a cancel.
            rows = _fetch_light(db, GET_JOB_LIGHT, GET_JOB, params)
            return rows[0] if rows else None

        return await self._transaction("request_cancel", cancel)

    async def list_cancel_requested(self, owner_instance: str) -> list[str]:
        async with self._read("list_cancel_requested") as conn:
            rows = await conn.execute_fetchall(
                LIST_CANCEL_REQUESTED, {"owner_instance": owner_instance}
            )
            return [r[0] for r in rows]

    async def save_progress(self, job_id: str, owner_instance: str, progress: Progress) -> bool:
        params = {"job_id": job_id, "owner_instance": owner_instance,
                  "output_bytes": progress.output_bytes, "output": progress.output,
                  "stderr_tail": progress.stderr_tail}
        return await self._transaction(
            "save_progress", lambda db, now: _changed(db, SAVE_PROGRESS, {**params, "now": now})) == 1

    # -- the reaper -----------------------------------------------------------------------
    async def list_expired_candidates(
        self, http_grace_s: float, limit: int = REAPER_BATCH_ROWS
    ) -> list[JobRow]:
        async with self._read("list_expired_candidates") as conn:
            rows = await conn.execute_fetchall(LIST_EXPIRED_CANDIDATES, {
                "now": self.clock(), "http_grace_s": http_grace_s, "limit": max(limit, 0)})
            return [_job(r) for r in rows]

    async def recover_expired_leases(
        self, http_grace_s: float, job_ids: Collection[str], orphaned_by: str | None = None,
    ) -> list[JobRow]:
        if not job_ids:
            return []
        params = {"http_grace_s": http_grace_s, "job_ids": json.dumps(list(job_ids)),
                  "orphaned_error": ORPHANED_ERROR, "orphaned_by": orphaned_by}
        return await self._transaction("recover_expired_leases", lambda db, now: [
            _job(r) for r in db.execute(RECOVER_EXPIRED_LEASES, {**params, "now": now})])

    # -- retention and reads --------------------------------------------------------------
    async def purge_terminal(self, older_than_s: float,
                             limit: int = RETENTION_BATCH_ROWS) -> list[str]:
        params = {"older_than_s": older_than_s, "limit": max(limit, 0)}
        return await self._transaction("purge_terminal", lambda db, now: [
            r[0] for r in db.execute(PURGE_TERMINAL, {**params, "now": now})])

    async def find_job_ids(self, prefix: str, limit: int = PREFIX_MATCH_LIMIT) -> list[str]:
        if not prefix:
            return []
        params = {"pattern": like_prefix(prefix), "prefix": prefix, "limit": max(limit, 0)}
        async with self._read("find_job_ids") as conn:
            return [row[0] for row in await conn.execute_fetchall(FIND_JOB_IDS, params)]

    async def get_job(self, job_id: str, *, with_output: bool = True) -> JobRow | None:
        if not with_output:
            rows = await self._light_rows("get_job", GET_JOB_LIGHT, GET_JOB, {"job_id": job_id})
            return rows[0] if rows else None
        async with self._read("get_job") as conn:
            found = list(await conn.execute_fetchall(GET_JOB, {"job_id": job_id}))
            return _job(found[0]) if found else None

    async def _light_rows(self, action: str, light_sql: str, full_sql: str,
                          params: Mapping[str, Any]) -> list[JobRow]:
        async with self._read(action) as conn:
            return await on_connection_thread(
                conn, lambda db: _fetch_light(db, light_sql, full_sql, params))

    async def read_output(
        self, job_id: str, offset: int, length: int, *, answer: bool = False
    ) -> tuple[bytes, int] | None:
        async with self._read("read_output") as conn:
            return await on_connection_thread(
                conn, lambda raw: _read_output(raw, job_id, offset, length, answer))

    async def list_jobs(
        self, *, statuses: Sequence[JobStatus] | None = None, provider: str | None = None,
        owner_instance: str | None = None, principal: str | None = None,
        unowned_too: bool = False, limit: int = 50, with_output: bool = True,
    ) -> list[JobRow]:
        params = {
            "statuses": None if statuses is None
            else json.dumps([JobStatus(s).value for s in statuses]),
            "provider": provider, "owner_instance": owner_instance, "limit": max(limit, 0),
            "principal": principal, "unowned_too": unowned_too,
        }
        if not with_output:
            return await self._light_rows("list_jobs", LIST_JOBS_LIGHT, LIST_JOBS, params)
        async with self._read("list_jobs") as conn:
            return [_job(r) for r in await conn.execute_fetchall(LIST_JOBS, params)]

    async def list_jobs_page(self, page: JobsPage) -> list[JobRow]:
        return await self._light_rows("list_jobs_page", LIST_JOBS_PAGE_LIGHT, LIST_JOBS_PAGE,
                                      jobs_page_params(page))

    # -- detach, adoption, re-queue ---------------------------------------------------------
    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        if not seconds:
            return 0
        params = {"instance_id": instance_id, "seconds": json.dumps(dict(seconds))}
        return await self._transaction("extend_leases", lambda db, now: _changed(
            db, EXTEND_LEASES, {**params, "now": now}))

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        params = {"instance_id": instance_id, "hostname": hostname, "boot_id": boot_id,
                  "orphaned_within_s": orphaned_within_s, "limit": max(limit, 0),
                  "now": time.time()}
        async with self._read("list_adoption_candidates") as conn:
            rows = await conn.execute_fetchall(LIST_ADOPTION_CANDIDATES, params)
        return [_candidate(row) for row in rows]

    async def _take_over(self, action: str, sql: str, take: TakeOver) -> JobRow | None:
        params = {"job_id": take.job_id, "expected_owner": take.expected_owner,
                  "expected_status": take.expected_status.value,
                  "instance_id": take.instance_id, "hostname": take.hostname,
                  "boot_id": take.boot_id, "ttl_s": take.ttl_s,
                  "requeue_reasons": take.requeue_reasons}

        def write(db: sqlite3.Connection, now: float) -> JobRow | None:
            row = db.execute(sql, {**params, "now": now}).fetchone()
            return _job(row) if row is not None else None

        return await self._transaction(action, write)

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("adopt_job", ADOPT_JOB, take)

    # -- usage and budgets (usage.py) ---------------------------------------------------
    async def usage_totals(self, group_by: GroupBy, since_day: str | None = None,
                           until_day: str | None = None) -> list[UsageRow]:
        async with self._read("usage_totals") as conn:
            return await on_connection_thread(conn, lambda db: sqlite_usage.usage_totals(
                db, group_by, since_day, until_day))

    async def budget_windows(self, budgets: Sequence[tuple[str, str]]) -> list[BudgetWindow]:
        now = self.clock()
        async with self._read("budget_windows") as conn:
            return await on_connection_thread(
                conn, lambda db: sqlite_usage.budget_windows(db, budgets, now))

    async def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        await anyio.sleep(timeout_s)  # no notices here: the caller polls

    async def claim_sweep(self, task: str, every_s: float) -> bool:
        return await self._transaction(
            "claim_sweep", lambda db, now: sqlite_sweeps.claim_sweep(db, task, every_s, now))

    async def sweep_runs(self, task: str) -> int:
        async with self._read("sweep_runs") as conn:
            return await sqlite_sweeps.sweep_runs(conn, task)

    # -- worker hosts: one host has no remote jobs (admission refuses them) --------------------
    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        params = {"instance_id": instance_id, "capabilities": capabilities}
        return await self._transaction("publish_capabilities", lambda db, now: _changed(
            db, PUBLISH_CAPABILITIES, params)) == 1

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        return []

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        return []

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        return 0

    async def put_patch(self, patch: RemotePatch) -> bool:
        return False

    async def get_patch(self, job_id: str) -> RemotePatch | None:
        return None

    async def request_worktree_removal(self, job_id: str) -> bool:
        return False

    async def worktree_removals(self, hostname: str) -> list[str]:
        return []

    async def worktree_removed(self, job_id: str) -> bool:
        return False

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        return []

    async def release_reservations(self) -> int:
        return await self._transaction("release_reservations",
                                       lambda db, now: sqlite_usage.release_ended(db))

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("requeue_job", REQUEUE_JOB, take)
