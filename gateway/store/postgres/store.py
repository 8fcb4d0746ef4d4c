"""PostgreSQL JobStore (asyncpg pool): the backend several gateways on several hosts share.

All SQL of this backend is below as named module constants; each says which invariant its
WHERE clause enforces. Every state transition is ONE conditional statement, so PostgreSQL's
row locks arbitrate races: under READ COMMITTED an UPDATE that waited for another
transaction's row lock re-evaluates its WHERE clause on the committed row version before it
writes. The one decision that reads another table, the reaper's (a job's lease is also its
owner's instance lease), first locks the lapsed owners' rows (LOCK_EXPIRED_OWNERS): a
heartbeat that commits first saves its jobs, one that comes later waits and finds them
orphaned.

Clocks: every time written and every time compared is the database clock `now()`; the client
sends only durations in seconds (`now() + make_interval(secs => $n)`), never a timestamp, so
no instance's wall clock decides another instance's fate (docs/architecture.md, Clocks). Columns are
`timestamptz`; asyncpg decodes them as timezone-aware UTC datetimes whatever the session
TimeZone is.

Failures to reach the server (refused, reset, timed out, server shutting down, pool closed)
become StoreUnavailable with a message that never contains the DSN's password. The pool
drops a connection that broke, and opens a fresh one on the next call, so the store works
again as soon as the server is back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

import anyio
import asyncpg
import structlog

from gateway.model import (
    CANCELLED_ERROR,
    FINAL_STATUSES,
    ORPHANED_ERROR,
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    OutputFile,
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
    StoreUnavailable,
    TakeOver,
    WorkerClaim,
    answer_in,
    like_prefix,
    output_to_bind,
    page_bounds,
    page_of,
    without_output,
)
from gateway.store.owner_columns import owner_fields
from gateway.store.postgres import meta as postgres_meta
from gateway.store.postgres import sweeps as postgres_sweeps
from gateway.store.postgres import usage as postgres_usage
from gateway.store.postgres import workers as postgres_workers
from gateway.store.postgres.errors import (
    _UNAVAILABLE_ERRORS,
    redact_dsn,
    secrets_of,
    unavailable_error,
)
from gateway.store.postgres.notices import JobNotices
from gateway.store.postgres.pool import (
    COMMAND_TIMEOUT_S,
    IDLE_RELEASE_S,
    LEASE_COMMAND_TIMEOUT_S,
    LEASE_IDLE_RELEASE_S,
    LEASE_PATIENCE_S,
    READ_PATIENCE_S,
    WORK_PATIENCE_S,
    ConnectionPool,
    FullServer,
    Pooler,
)
from gateway.store.postgres.sql import (
    _JSON_ERRORS,
    ACTIVE_INDEX_NAME,
    ADOPT_JOB,
    COMPLETE_JOB,
    COMPLETE_JOB_FROM_PIECES,
    CREATE_OUTPUT_PIECES,
    CREATE_SCHEMA_VERSION_TABLE,
    EXTEND_LEASES,
    FIND_ACTIVE_BY_KEY,
    FIND_JOB_IDS,
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
    LOCK_EXPIRED_OWNERS,
    LOCK_SCHEMA,
    MARK_INSTANCE_STOPPED,
    MARK_RUNNING,
    MIGRATIONS,
    OUTPUT_PIECES_TABLE,
    PURGE_TERMINAL,
    READ_NOW,
    READ_OUTPUT,
    READ_RESULT_JSON,
    READ_SCHEMA_VERSION,
    RECORD_PROCESS,
    RECORD_SCHEMA_VERSION,
    RECOVER_EXPIRED_LEASES,
    RENEW_INSTANCE_LEASE,
    REQUEST_CANCEL_LIGHT,
    REQUEUE_JOB,
    RETURN_TO_POOL,
    SAVE_PROGRESS,
    UPSERT_INSTANCE,
)
from gateway.store.usage import BudgetWindow, GroupBy, UsageRow

log = structlog.get_logger(__name__)

MAX_SQL_POSITION = 2**31 - 2  # substring(... FROM start + 1 FOR n) with int4 arguments


def _status_count(status: str) -> int:
    """Rows affected, from a command tag such as `UPDATE 3` or `DELETE 0`."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


def _savepoint(conn: asyncpg.Connection) -> AbstractAsyncContextManager[object]:
    """Around a statement whose failure the caller handles by running another: inside a
    transaction (always, behind PgBouncer) a savepoint, so the failure does not abort the
    rest; outside one, nothing (the statement is its own transaction)."""
    return conn.transaction() if conn.is_in_transaction() else nullcontext()


def _job(row: asyncpg.Record) -> JobRow:
    return JobRow.from_mapping(row)


async def _light_job(conn: asyncpg.Connection, job_id: str) -> JobRow | None:
    """The row without its output or answer text (as _light_rows reads rows)."""
    rows = await _light_rows(conn, GET_JOB_LIGHT, GET_JOB, (job_id,))
    return rows[0] if rows else None


async def _light_rows(conn: asyncpg.Connection, light_sql: str, full_sql: str,
                      params: tuple[object, ...]) -> list[JobRow]:
    """Rows without their output or answer text, stripped in SQL; a result_json that is
    not JSON (never written by complete()) makes that fail: then stripped in Python."""
    try:
        async with _savepoint(conn):
            rows = await conn.fetch(light_sql, *params)
    except _JSON_ERRORS:
        return [without_output(_job(row)) for row in await conn.fetch(full_sql, *params)]
    return [_job(row) for row in rows]


async def _output_pieces(source: OutputFile) -> AsyncIterator[tuple[int, str]]:
    """(seq, text) rows of a large output for COPY, each piece read in a thread: file reads
    stay off the event loop, and one piece at a time is held."""
    pieces = source.text_chunks()
    try:
        seq = 0
        while (piece := await anyio.to_thread.run_sync(next, pieces, None)) is not None:
            yield seq, piece
            seq += 1
    finally:
        pieces.close()


def _instance(row: asyncpg.Record) -> InstanceRow:
    return InstanceRow(**dict(row.items()))


class PostgresJobStore:
    """JobStore on a PostgreSQL database shared by any number of gateway instances."""

    backend = "postgres"

    def __init__(self, dsn: str, *, max_size: int = 10, pooler: Pooler = "none") -> None:
        self._dsn = dsn
        self._max_size = max_size
        self._pooler: Pooler = pooler
        self._secrets = secrets_of(dsn)
        self._pool: ConnectionPool | None = None
        # The heartbeat, registration and the clock read go through a pool of one of their
        # own: result reads and COPYs of large outputs can hold every connection of the work
        # pool for long, and a heartbeat that waits for one lets its own lease lapse.
        self._lease_pool: ConnectionPool | None = None
        # LISTEN needs a session of its own: none behind a transaction pooler.
        self._notices = JobNotices(dsn, enabled=pooler == "none")

    def __repr__(self) -> str:
        return f"PostgresJobStore({redact_dsn(self._dsn)!r})"

    # -- errors and connections -----------------------------------------------------------
    def _unavailable(self, action: str, exc: BaseException) -> StoreUnavailable:
        return unavailable_error(action, exc, self._secrets)

    @asynccontextmanager
    async def _connection(self, action: str, *, lease: bool = False,
                          patience_s: float | None = None,
                          ) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection within `patience_s` (lease=True: from the heartbeat's pool,
        which nothing else can exhaust; its calls are patient for LEASE_PATIENCE_S unless
        told otherwise); connection-level failures become StoreUnavailable.
        A broken connection is dropped by its pool and a fresh one opened by the next call.

        The cause is not chained (`from None`): asyncpg's exception objects can carry the
        connection parameters, and a traceback must not show them.
        """
        pool = self._lease_pool if lease else self._pool
        if pool is None:
            raise StoreUnavailable(f"postgres store: {action} failed (store is not open)")
        try:
            if patience_s is None:
                patience_s = LEASE_PATIENCE_S if lease else READ_PATIENCE_S
            async with pool.connection(patience_s) as conn:
                yield conn
        except _UNAVAILABLE_ERRORS as exc:
            raise self._unavailable(action, exc) from None

    @asynccontextmanager
    async def _transaction(self, action: str, *, patience_s: float = READ_PATIENCE_S,
                           ) -> AsyncIterator[asyncpg.Connection]:
        async with self._connection(action, patience_s=patience_s) as conn:
            if conn.is_in_transaction():  # behind PgBouncer every call is one already
                yield conn
                return
            async with conn.transaction():
                yield conn

    def pool_stats(self) -> dict[str, object]:
        """The pools' sizes and waits (`gateway_status`, `doctor`): how close this gateway is
        to its connection budget, and whether the server turned connections away."""
        return {"pooler": self._pooler,
                "work": self._pool.stats() if self._pool is not None else None,
                "heartbeat": self._lease_pool.stats() if self._lease_pool is not None else None}

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self) -> None:
        """Create the pools and create/migrate the schema under an advisory lock.

        Raises StoreUnavailable when the server cannot be reached, refuses the credentials,
        or holds a schema written by a newer gateway.
        """
        if self._pool is not None:
            return
        full_server = FullServer()
        try:
            pool = await ConnectionPool.create(
                "work", self._dsn, max_size=self._max_size, idle_s=IDLE_RELEASE_S,
                command_timeout_s=COMMAND_TIMEOUT_S, pooler=self._pooler,
                full_server=full_server)
            lease_pool = await ConnectionPool.create(
                "heartbeat", self._dsn, max_size=1, idle_s=LEASE_IDLE_RELEASE_S,
                command_timeout_s=LEASE_COMMAND_TIMEOUT_S, pooler=self._pooler,
                full_server=full_server)
        except (*_UNAVAILABLE_ERRORS, ValueError, asyncpg.ClientConfigurationError) as exc:
            raise self._unavailable("open", exc) from None
        self._pool = pool
        try:
            await self._migrate()
            self._lease_pool = lease_pool
        except BaseException as exc:
            self._pool = None
            pool.terminate()
            lease_pool.terminate()
            if isinstance(exc, _UNAVAILABLE_ERRORS):
                raise self._unavailable("open", exc) from None
            raise

    async def _migrate(self) -> None:
        async with self._transaction("migrate schema", patience_s=WORK_PATIENCE_S) as conn:
            await conn.execute(LOCK_SCHEMA)
            await conn.execute(CREATE_SCHEMA_VERSION_TABLE)
            current = int(await conn.fetchval(READ_SCHEMA_VERSION))
            # Before the first write: a database this gateway may no longer write is refused.
            meta = await postgres_meta.refuse_unless_writable(conn, current)
            applied = []
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(RECORD_SCHEMA_VERSION, version)
                applied.append(version)
                log.info("schema migrated", action="migrate_schema", version=version)
            await postgres_meta.record_migration(conn, applied, meta)

    async def close(self) -> None:
        pools = [p for p in (self._pool, self._lease_pool) if p is not None]
        self._pool = self._lease_pool = None
        await self._notices.close()
        for pool in pools:
            await pool.close()  # a dead server or a stuck borrower: terminated, no hang

    async def schema_version(self) -> int:
        async with self._connection("read schema version") as conn:
            return int(await conn.fetchval(READ_SCHEMA_VERSION))

    async def now(self) -> float:
        async with self._connection("read clock", lease=True) as conn:
            return float(await conn.fetchval(READ_NOW))

    # -- instances ------------------------------------------------------------------------
    async def register_instance(self, instance: InstanceRow, ttl_s: float) -> None:
        """Upsert the instance row. started_at, heartbeat_at and the lease come from the
        database clock (the row's own started_at is ignored: no client time is stored)."""
        async with self._connection("register instance", lease=True,
                                    patience_s=WORK_PATIENCE_S) as conn:
            await conn.execute(
                UPSERT_INSTANCE,
                instance.instance_id, instance.hostname, instance.boot_id, instance.pid,
                instance.pid_started_at, instance.role, instance.version, float(ttl_s),
                instance.capabilities,
            )

    async def mark_instance_stopped(self, instance_id: str) -> None:
        async with self._connection("mark instance stopped", patience_s=WORK_PATIENCE_S) as conn:
            await conn.execute(MARK_INSTANCE_STOPPED, instance_id)

    async def heartbeat(self, instance_id: str, ttl_s: float,
                        renewal_wait_ms: float | None = None) -> int:
        # One row whatever the job count: the instance lease covers all of its jobs.
        async with self._connection("heartbeat", lease=True) as conn:
            renewed = await conn.execute(RENEW_INSTANCE_LEASE, instance_id, float(ttl_s),
                                         renewal_wait_ms)
        return _status_count(renewed)

    async def gc_instances(self, older_than_s: float, hostname: str | None = None,
                           keep: Sequence[str] = ()) -> int:
        async with self._connection("gc instances") as conn:
            return _status_count(await conn.execute(GC_INSTANCES, float(older_than_s),
                                                    hostname, list(keep)))

    async def list_instances(self) -> list[InstanceRow]:
        async with self._connection("list instances") as conn:
            return [_instance(row) for row in await conn.fetch(LIST_INSTANCES)]

    # -- admission and transitions --------------------------------------------------------
    async def find_reusable(self, request_key: str, dedup_window_s: float) -> JobRow | None:
        async with self._connection("find reusable job") as conn:
            row = await conn.fetchrow(FIND_REUSABLE_LIGHT, request_key, float(dedup_window_s))
        return _job(row) if row is not None else None

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        """Insert a queued (or running) row; DuplicateActiveJob if an active twin exists,
        ValueError if the id is taken."""
        # Invariant: the job and its budget reservations commit together or not at all
        # (BudgetExceeded rolls the insert back): postgres_usage.RESERVE_BUDGET.
        scope = self._transaction if job.reservations else self._connection
        async with scope("insert job") as conn:
            try:
                async with _savepoint(conn):
                    row = await conn.fetchrow(
                        INSERT_JOB,
                        job.id, job.provider, job.request_key, job.transport,
                        job.correlation_id, job.owner_instance, float(ttl_s), job.hostname,
                        job.working_dir, job.model, job.session_id, job.request_json,
                        job.forced, job.boot_id, job.principal, job.running, job.runs_on,
                    )
                    await postgres_usage.reserve(conn, job.id, job.reservations)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != ACTIVE_INDEX_NAME:
                    raise ValueError(f"job id {job.id} already exists") from None
                existing = await conn.fetchval(FIND_ACTIVE_BY_KEY, job.request_key)
                raise DuplicateActiveJob(existing) from None
        assert row is not None  # INSERT ... RETURNING always returns the row it inserted
        return _job(row)

    async def mark_running(self, job_id: str, owner_instance: str, ttl_s: float) -> bool:
        async with self._connection("mark running", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(
                MARK_RUNNING, job_id, owner_instance, float(ttl_s)
            )
        return _status_count(status) == 1

    async def record_process(
        self, job_id: str, owner_instance: str, pid: int, pgid: int, pid_started_at: float
    ) -> bool:
        async with self._connection("record process", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(
                RECORD_PROCESS, job_id, owner_instance, pid, pgid, pid_started_at
            )
        return _status_count(status) == 1

    async def complete(self, job_id: str, owner_instance: str,
                       completion: Completion) -> JobRow | None:
        """Guarded terminal write; ValueError if the completion is not a final status."""
        if completion.status not in FINAL_STATUSES:
            raise ValueError(f"a completion cannot be {completion.status!s}")
        output, pieces = output_to_bind(completion.output)
        params = (job_id, owner_instance, completion.status.value, completion.error_kind,
                  completion.error, completion.exit_code, output, completion.stderr_tail,
                  completion.output_bytes, completion.truncated, completion.result_json,
                  CANCELLED_ERROR, completion.ended_at)
        if pieces is None:
            async with self._transaction("complete job", patience_s=WORK_PATIENCE_S) as conn:
                applied = _status_count(await conn.execute(COMPLETE_JOB, *params)) == 1
                if not applied:
                    return None
                await postgres_usage.account(conn, job_id, completion.usage)  # settled once
                return await _light_job(conn, job_id)
        # Invariant: the pieces go into a table only this transaction sees; the status and
        # the output are then set by ONE guarded UPDATE, so the compare-and-set is still a
        # single statement and a reader sees the row active, or terminal with its whole
        # output. A write that lost the CAS leaves nothing (the table is dropped at commit).
        async with self._transaction("complete job", patience_s=WORK_PATIENCE_S) as conn:
            await conn.execute(CREATE_OUTPUT_PIECES)
            await conn.copy_records_to_table(
                OUTPUT_PIECES_TABLE, records=_output_pieces(pieces), columns=("seq", "piece"))
            applied = _status_count(await conn.execute(COMPLETE_JOB_FROM_PIECES, *params)) == 1
            if not applied:
                return None
            await postgres_usage.account(conn, job_id, completion.usage)
            return await _light_job(conn, job_id)

    # -- usage and budgets (usage.py) ---------------------------------------------------
    async def usage_totals(self, group_by: GroupBy, since_day: str | None = None,
                           until_day: str | None = None) -> list[UsageRow]:
        async with self._connection("usage totals") as conn:
            return await postgres_usage.usage_totals(conn, group_by, since_day, until_day)

    async def budget_windows(self, budgets: Sequence[tuple[str, str]]) -> list[BudgetWindow]:
        async with self._connection("budget windows") as conn:
            return await postgres_usage.budget_windows(conn, budgets)

    async def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        await self._notices.wait(job_id, timeout_s)

    async def claim_sweep(self, task: str, every_s: float) -> bool:
        async with self._transaction("claim sweep") as conn:
            return await postgres_sweeps.claim_sweep(conn, task, every_s)

    async def sweep_runs(self, task: str) -> int:
        async with self._connection("read sweep runs") as conn:
            return await postgres_sweeps.sweep_runs(conn, task)

    # -- worker hosts (workers.py) ----------------------------------------------------------
    async def publish_capabilities(self, instance_id: str, capabilities: str) -> bool:
        async with self._connection("publish capabilities", lease=True) as conn:
            status = await conn.execute(postgres_workers.PUBLISH_CAPABILITIES, instance_id,
                                        capabilities)
        return _status_count(status) == 1

    async def claim_jobs(self, claim: WorkerClaim, limit: int) -> list[JobRow]:
        async with self._transaction("claim jobs", patience_s=WORK_PATIENCE_S) as conn:
            return await postgres_workers.claim_jobs(conn, claim, limit)

    async def return_to_pool(self, taker: InstanceRow, ttl_s: float, http_grace_s: float,
                             job_ids: Collection[str]) -> list[str]:
        if not job_ids:
            return []
        async with self._connection("return jobs to the pool") as conn:
            rows = await conn.fetch(RETURN_TO_POOL, taker.instance_id, taker.hostname,
                                    taker.boot_id, float(ttl_s), float(http_grace_s),
                                    list(job_ids))
        return [row["id"] for row in rows]

    async def set_unschedulable(self, owner_instance: str,
                                reasons: Mapping[str, str | None]) -> int:
        if not reasons:
            return 0
        ids = list(reasons)
        async with self._connection("set unschedulable") as conn:
            return _status_count(await conn.execute(
                postgres_workers.SET_UNSCHEDULABLE, owner_instance, ids,
                [reasons[i] for i in ids]))

    async def put_patch(self, patch: RemotePatch) -> bool:
        async with self._connection("put patch") as conn:
            return _status_count(await conn.execute(
                postgres_workers.PUT_PATCH, patch.job_id, patch.hostname, patch.base_sha,
                patch.tip, patch.size, patch.patch)) == 1

    async def get_patch(self, job_id: str) -> RemotePatch | None:
        async with self._connection("get patch") as conn:
            row = await conn.fetchrow(postgres_workers.GET_PATCH, job_id)
        if row is None:
            return None
        return RemotePatch(job_id=row["job_id"], hostname=row["hostname"],
                           base_sha=row["base_sha"], tip=row["tip"], size=int(row["size"]),
                           patch=None if row["patch"] is None else bytes(row["patch"]),
                           discard_requested=bool(row["discard_requested"]))

    async def request_worktree_removal(self, job_id: str) -> bool:
        async with self._connection("request worktree removal") as conn:
            return _status_count(await conn.execute(
                postgres_workers.REQUEST_REMOVAL, job_id)) == 1

    async def worktree_removals(self, hostname: str) -> list[str]:
        async with self._connection("worktree removals") as conn:
            rows = await conn.fetch(postgres_workers.WORKTREE_REMOVALS, hostname)
        return [row["job_id"] for row in rows]

    async def worktree_removed(self, job_id: str) -> bool:
        async with self._connection("worktree removed") as conn:
            return _status_count(await conn.execute(
                postgres_workers.WORKTREE_REMOVED, job_id)) == 1

    async def fail_unscheduled(self, owner_instance: str, queue_timeout_s: float,
                               error: str) -> list[str]:
        async with self._connection("fail unscheduled jobs") as conn:
            rows = await conn.fetch(postgres_workers.FAIL_UNSCHEDULED, owner_instance,
                                    float(queue_timeout_s), error)
        return [row["id"] for row in rows]

    async def release_reservations(self) -> int:
        async with self._transaction("release reservations") as conn:
            return await postgres_usage.release_ended(conn)

    async def request_cancel(self, job_id: str) -> JobRow | None:
        async with self._connection("request cancel") as conn:
            row = await conn.fetchrow(REQUEST_CANCEL_LIGHT, job_id)
            if row is None:  # not active, or already requested: the row as it is now
                row = await conn.fetchrow(GET_JOB_LIGHT, job_id)
        return _job(row) if row is not None else None

    async def list_cancel_requested(self, owner_instance: str) -> list[str]:
        async with self._connection("list cancel requests") as conn:
            rows = await conn.fetch(LIST_CANCEL_REQUESTED, owner_instance)
        return [row["id"] for row in rows]

    async def save_progress(self, job_id: str, owner_instance: str, progress: Progress) -> bool:
        async with self._connection("save progress", patience_s=WORK_PATIENCE_S) as conn:
            status = await conn.execute(
                SAVE_PROGRESS, job_id, owner_instance, progress.output_bytes, progress.output,
                progress.stderr_tail,
            )
        return _status_count(status) == 1

    # -- the reaper -----------------------------------------------------------------------
    async def list_expired_candidates(
        self, http_grace_s: float, limit: int = REAPER_BATCH_ROWS
    ) -> list[JobRow]:
        async with self._connection("list expired leases") as conn:
            rows = await conn.fetch(LIST_EXPIRED_CANDIDATES, float(http_grace_s), max(limit, 0))
        return [_job(row) for row in rows]

    async def recover_expired_leases(
        self, http_grace_s: float, job_ids: Collection[str], orphaned_by: str | None = None,
    ) -> list[JobRow]:
        if not job_ids:
            return []
        async with self._transaction("recover expired leases") as conn:
            owners = [row["instance_id"] for row in await conn.fetch(LOCK_EXPIRED_OWNERS)]
            rows = await conn.fetch(RECOVER_EXPIRED_LEASES, float(http_grace_s),
                                    list(job_ids), ORPHANED_ERROR, owners, orphaned_by)
        return [_job(row) for row in rows]

    # -- retention and reads --------------------------------------------------------------
    async def purge_terminal(self, older_than_s: float,
                             limit: int = RETENTION_BATCH_ROWS) -> list[str]:
        async with self._connection("purge terminal jobs") as conn:
            rows = await conn.fetch(PURGE_TERMINAL, float(older_than_s), max(limit, 0))
        return [row["id"] for row in rows]

    async def find_job_ids(self, prefix: str, limit: int = PREFIX_MATCH_LIMIT) -> list[str]:
        if not prefix:
            return []
        async with self._connection("find job ids") as conn:
            rows = await conn.fetch(FIND_JOB_IDS, like_prefix(prefix), max(limit, 0))
        return [row["id"] for row in rows]

    async def get_job(self, job_id: str, *, with_output: bool = True) -> JobRow | None:
        async with self._connection("get job") as conn:
            if with_output:
                row = await conn.fetchrow(GET_JOB, job_id)
                return _job(row) if row is not None else None
            return await _light_job(conn, job_id)

    async def read_output(
        self, job_id: str, offset: int, length: int, *, answer: bool = False
    ) -> tuple[bytes, int] | None:
        # substring() takes int4 positions; no field is over 1 GB, so past this is past the end.
        start = min(max(offset, 0), MAX_SQL_POSITION)
        length = min(max(length, 0), MAX_SQL_POSITION)
        async with self._connection("read output") as conn:
            try:
                async with _savepoint(conn):
                    row = await conn.fetchrow(READ_OUTPUT, job_id, start + 1, length, answer)
            except _JSON_ERRORS:
                where = answer_in(await conn.fetchval(READ_RESULT_JSON, job_id)) if answer else None
                if isinstance(where, str):
                    return page_of(where.encode("utf-8"), start, length)
                # The answer is a range of the output (or there is none): page the output.
                sized = await conn.fetchrow(READ_OUTPUT, job_id, 1, 0, False)
                if sized is None:
                    return None
                first, count, total = page_bounds(int(sized[1] or 0), start, length, where)
                row = await conn.fetchrow(READ_OUTPUT, job_id, first + 1, count, False)
                return (bytes(row[0] or b""), total) if row is not None else None
        if row is None:
            return None
        return bytes(row[0] or b""), int(row[1] or 0)

    async def list_jobs(
        self, *, statuses: Sequence[JobStatus] | None = None, provider: str | None = None,
        owner_instance: str | None = None, principal: str | None = None,
        unowned_too: bool = False, limit: int = 50, with_output: bool = True,
    ) -> list[JobRow]:
        wanted: list[str] | None = (
            [JobStatus(s).value for s in statuses] if statuses is not None else None
        )
        params = (wanted, provider, owner_instance, max(limit, 0), principal, unowned_too)
        async with self._connection("list jobs") as conn:
            if with_output:
                return [_job(row) for row in await conn.fetch(LIST_JOBS, *params)]
            return await _light_rows(conn, LIST_JOBS_LIGHT, LIST_JOBS, params)

    async def list_jobs_page(self, page: JobsPage) -> list[JobRow]:
        wanted = [s.value for s in page.statuses] if page.statuses is not None else None
        params = (wanted, page.provider, page.hostname, page.after_id, max(page.limit, 0))
        async with self._connection("list jobs page") as conn:
            return await _light_rows(conn, LIST_JOBS_PAGE_LIGHT, LIST_JOBS_PAGE, params)

    # -- detach, adoption, re-queue ---------------------------------------------------------
    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        if not seconds:
            return 0
        ids = list(seconds)
        async with self._connection("extend leases", patience_s=WORK_PATIENCE_S) as conn:
            return _status_count(await conn.execute(
                EXTEND_LEASES, instance_id, ids, [float(seconds[i]) for i in ids]))

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        async with self._connection("list adoption candidates") as conn:
            rows = await conn.fetch(LIST_ADOPTION_CANDIDATES, instance_id, hostname, boot_id,
                                    max(limit, 0))
        return [_candidate(row) for row in rows]

    async def _take_over(self, action: str, sql: str, take: TakeOver,
                         *extra: object) -> JobRow | None:
        async with self._connection(action) as conn:
            row = await conn.fetchrow(sql, take.job_id, take.expected_owner,
                                      take.expected_status.value, take.instance_id,
                                      take.hostname, take.boot_id, float(take.ttl_s), *extra)
        return _job(row) if row is not None else None

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("adopt job", ADOPT_JOB, take)

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        return await self._take_over("requeue job", REQUEUE_JOB, take, take.requeue_reasons)


def _candidate(row: asyncpg.Record) -> AdoptionCandidate:
    owner = owner_fields(row)
    return AdoptionCandidate(job=_job(row), owner=None if owner is None else InstanceRow(**owner))
