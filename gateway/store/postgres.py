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
no instance's wall clock decides another instance's fate (DESIGN.md section 3). Columns are
`timestamptz`; asyncpg decodes them as timezone-aware UTC datetimes whatever the session
TimeZone is.

Failures to reach the server (refused, reset, timed out, server shutting down, pool closed)
become StoreUnavailable with a message that never contains the DSN's password. The pool
drops a connection that broke, and opens a fresh one on the next call, so the store works
again as soon as the server is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlsplit

import asyncpg
import structlog

from gateway.jobs.model import (
    FINAL_STATUSES,
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    OutputFile,
    Progress,
)
from gateway.store.base import (
    SCHEMA_VERSION,
    DuplicateActiveJob,
    StoreUnavailable,
    answer_in,
    output_to_bind,
    page_of,
    without_output,
)

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 10.0  # an unreachable host must fail a call, not hang the heartbeat
COMMAND_TIMEOUT_S = 25.0  # a statement stuck behind a lock or a dying server gives up
ACQUIRE_TIMEOUT_S = 30.0  # a pool exhausted by stuck calls fails the next call, not forever
CLOSE_TIMEOUT_S = 5.0  # close() waits this long for borrowed connections, then terminates
LOCK_TIMEOUT_MS = 5000  # a row lock held longer than this is a stuck peer: fail the call
APPLICATION_NAME = "agent-cli-gateway"  # so operators can find our sessions in pg_stat_activity

# pg_advisory_xact_lock key that serializes schema migration between instances starting at
# once: the ASCII bytes of "acg_schm" read as a bigint (positive, fits int8).
SCHEMA_LOCK_KEY = int.from_bytes(b"acg_schm", "big")

ORPHANED_ERROR = "owning gateway instance stopped renewing its lease"  # as memory/sqlite
CANCELLED_ERROR = "cancelled at the caller's request"  # as memory/sqlite

ACTIVE_INDEX_NAME = "jobs_active_request_key"

_JOB_COLUMNS = ", ".join(JobRow.column_names())
_INSTANCE_COLUMNS = (
    "instance_id, hostname, boot_id, pid, pid_started_at, role, version, started_at, "
    "heartbeat_at, lease_expires_at, stopped_at"
)

# -- schema -------------------------------------------------------------------------------

# Taken first in the migration transaction, released at its commit: only one instance at a
# time inspects and changes the schema, so concurrent `CREATE ... IF NOT EXISTS` never race.
LOCK_SCHEMA = f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})"

# One row per applied migration; created under LOCK_SCHEMA like everything else.
CREATE_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL
)"""

# 0 for a database no gateway has touched yet.
READ_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"

# Each version is recorded once (primary key), by the instance holding the schema lock.
RECORD_SCHEMA_VERSION = "INSERT INTO schema_version (version, applied_at) VALUES ($1, now())"

_SCHEMA_V1 = (
    """
    CREATE TABLE IF NOT EXISTS jobs (
        id                  text PRIMARY KEY,
        provider            text NOT NULL,
        status              text NOT NULL CHECK (status IN
                            ('queued','running','completed','failed','cancelled',
                             'timed_out','orphaned')),
        request_key         text NOT NULL,
        correlation_id      text,
        transport           text NOT NULL DEFAULT 'process'
                            CHECK (transport IN ('process','http')),
        owner_instance      text,
        lease_deadline      timestamptz,
        hostname            text,
        pid                 integer,
        pgid                integer,
        pid_started_at      double precision,
        working_dir         text,
        model               text,
        session_id          text,
        request_json        text NOT NULL DEFAULT '{}',
        created_at          timestamptz NOT NULL,
        started_at          timestamptz,
        finished_at         timestamptz,
        updated_at          timestamptz NOT NULL,
        exit_code           integer,
        error               text,
        error_kind          text,
        output              text,
        stderr_tail         text,
        output_bytes        bigint NOT NULL DEFAULT 0,
        truncated           boolean NOT NULL DEFAULT false,
        result_json         text,
        cancel_requested_at timestamptz,
        forced              boolean NOT NULL DEFAULT false,
        boot_id             text
    )""",
    """
    CREATE TABLE IF NOT EXISTS gateway_instances (
        instance_id      text PRIMARY KEY,
        hostname         text NOT NULL,
        boot_id          text NOT NULL,
        pid              integer NOT NULL,
        pid_started_at   double precision,
        role             text NOT NULL,
        version          text NOT NULL,
        started_at       timestamptz NOT NULL,
        heartbeat_at     timestamptz NOT NULL,
        lease_expires_at timestamptz NOT NULL,
        stopped_at       timestamptz
    )""",
    # Exactly-once dedup: at most one active, non-forced job per request key, whoever races
    # (the loser's INSERT fails with a unique violation naming this index).
    f"""
    CREATE UNIQUE INDEX IF NOT EXISTS {ACTIVE_INDEX_NAME}
        ON jobs (request_key) WHERE status IN ('queued','running') AND NOT forced""",
    # The reaper's range scan: active rows ordered by their own lease deadline.
    "CREATE INDEX IF NOT EXISTS jobs_status_lease_deadline ON jobs (status, lease_deadline)",
    # The reaper's owner lock, the cancel poller and drain: one instance's active rows.
    "CREATE INDEX IF NOT EXISTS jobs_owner_status ON jobs (owner_instance, status)",
    # find_reusable: newest rows of one request key.
    "CREATE INDEX IF NOT EXISTS jobs_request_key_created ON jobs (request_key, created_at)",
    # purge_terminal: terminal rows by age.
    "CREATE INDEX IF NOT EXISTS jobs_status_finished ON jobs (status, finished_at)",
    # list_jobs: newest first.
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at)",
)

# (version, statements) in order; every statement is idempotent on its own as well.
# v2 changed only SQLite's table (`output` last in the row, for its in-place writes): a
# PostgreSQL row is never built in the client, and TOAST keeps a large value out of line.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = ((1, _SCHEMA_V1), (2, ()))
assert MIGRATIONS[-1][0] == SCHEMA_VERSION, "add a migration when SCHEMA_VERSION changes"

# -- instances ----------------------------------------------------------------------------

# Upsert: a re-registering instance (after a heartbeat outage) keeps its first started_at
# and is alive again (stopped_at cleared); its lease restarts from the database's now().
UPSERT_INSTANCE = f"""
INSERT INTO gateway_instances ({_INSTANCE_COLUMNS})
VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now(), now() + make_interval(secs => $8), NULL)
ON CONFLICT (instance_id) DO UPDATE SET
    hostname = excluded.hostname, boot_id = excluded.boot_id, pid = excluded.pid,
    pid_started_at = excluded.pid_started_at, role = excluded.role,
    version = excluded.version, heartbeat_at = excluded.heartbeat_at,
    lease_expires_at = excluded.lease_expires_at, stopped_at = NULL"""

# Only the first stop counts: the row records when the instance really went away.
MARK_INSTANCE_STOPPED = """
UPDATE gateway_instances SET stopped_at = now()
WHERE instance_id = $1 AND stopped_at IS NULL"""

# Renews exactly one instance row (the caller's own). This row IS the lease of every job the
# instance owns (the reaper reads it), so a heartbeat costs one row whatever the job count.
# It waits while a reaper holds this row locked (LOCK_EXPIRED_OWNERS), then renews a lease
# that had lapsed: the owner then finds its jobs orphaned and self-heals at completion.
RENEW_INSTANCE_LEASE = """
UPDATE gateway_instances
SET heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => $2)
WHERE instance_id = $1"""

# Only rows stopped, or whose lease expired, more than the threshold ago: a live instance's
# row (lease in the future) is never collected.
GC_INSTANCES = """
DELETE FROM gateway_instances
WHERE (stopped_at IS NOT NULL AND stopped_at < now() - make_interval(secs => $1))
   OR lease_expires_at < now() - make_interval(secs => $1)"""

LIST_INSTANCES = f"""
SELECT {_INSTANCE_COLUMNS} FROM gateway_instances ORDER BY started_at, instance_id"""

# -- admission and transitions ------------------------------------------------------------

# Reuse only non-forced rows that are active (any age) or completed within the window
# measured from finished_at on the database clock; failed/cancelled/timed_out/orphaned
# never match.
FIND_REUSABLE = f"""
SELECT {_JOB_COLUMNS} FROM jobs
WHERE request_key = $1 AND NOT forced
  AND (status IN ('queued','running')
       OR (status = 'completed' AND finished_at >= now() - make_interval(secs => $2)))
ORDER BY created_at DESC, id DESC
LIMIT 1"""

# A plain INSERT: the partial unique index jobs_active_request_key is the arbiter. Two
# instances racing with the same non-forced key: the second INSERT waits for the first
# transaction and then fails with a unique violation (mapped to DuplicateActiveJob).
INSERT_JOB = f"""
INSERT INTO jobs (id, provider, status, request_key, transport, correlation_id,
                  owner_instance, lease_deadline, hostname, working_dir, model, session_id,
                  request_json, created_at, updated_at, forced, boot_id)
VALUES ($1, $2, 'queued', $3, $4, $5,
        $6, now() + make_interval(secs => $7), $8, $9, $10, $11,
        $12, now(), now(), $13, $14)
RETURNING {_JOB_COLUMNS}"""

# The one active, non-forced row the index let win (NULL if it finished meanwhile).
FIND_ACTIVE_BY_KEY = """
SELECT id FROM jobs
WHERE request_key = $1 AND NOT forced AND status IN ('queued','running')
LIMIT 1"""

# queued -> running only for the owner: a row orphaned or cancelled while it waited in the
# queue never starts (the manager spawns only after this returns true).
MARK_RUNNING = """
UPDATE jobs SET status = 'running', pid = $3, pgid = $4, pid_started_at = $5,
                started_at = now(), updated_at = now(),
                lease_deadline = now() + make_interval(secs => $6)
WHERE id = $1 AND owner_instance = $2 AND status = 'queued'"""

# A process identity is stamped only on a running row this instance still owns.
RECORD_PROCESS = """
UPDATE jobs SET pid = $3, pgid = $4, pid_started_at = $5, updated_at = now()
WHERE id = $1 AND owner_instance = $2 AND status = 'running'"""

# Guarded terminal write: an active row, or an orphaned row of the same owner (self-heal of
# a stale owner that revived); every other terminal row is final. A cancel request on the
# row turns any outcome into `cancelled` (cancelled wins over a late completion).
_COMPLETE_JOB = """
UPDATE jobs SET
    status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE $3 END,
    error_kind = CASE WHEN cancel_requested_at IS NOT NULL AND $3 <> 'cancelled'
                      THEN 'cancelled' ELSE $4 END,
    error = CASE WHEN cancel_requested_at IS NOT NULL AND $3 <> 'cancelled'
                 THEN COALESCE($5, $12) ELSE $5 END,
    exit_code = $6, output = {output}, stderr_tail = $8,
    output_bytes = $9, truncated = $10, result_json = $11,
    finished_at = now(), updated_at = now(), lease_deadline = NULL
WHERE id = $1
  AND (status IN ('queued','running')
       OR (status = 'orphaned' AND owner_instance = $2))"""
COMPLETE_JOB = _COMPLETE_JOB.format(output="$7")

# A large output reaches the server in pieces (COPY into a temporary table of this
# transaction, dropped at its end), so the gateway never holds it whole; the guarded
# terminal write above then takes it from there in the same one statement ($7 is NULL).
CREATE_OUTPUT_PIECES = """
CREATE TEMPORARY TABLE IF NOT EXISTS job_output_pieces (seq integer NOT NULL, piece text NOT NULL)
ON COMMIT DROP"""
OUTPUT_PIECES_TABLE = "job_output_pieces"
COMPLETE_JOB_FROM_PIECES = _COMPLETE_JOB.format(
    output="COALESCE($7, (SELECT string_agg(piece, '' ORDER BY seq) FROM job_output_pieces), '')")

# A cancel lands only on an active row, and the first request's time is kept. Not a
# single statement with a fallback SELECT: under READ COMMITTED that SELECT would read the
# statement's snapshot, from before a completion this UPDATE waited for, and report a
# finished job as still running. request_cancel reads the row in a second statement.
REQUEST_CANCEL = f"""
UPDATE jobs SET cancel_requested_at = now(), updated_at = now()
WHERE id = $1 AND status IN ('queued','running') AND cancel_requested_at IS NULL
RETURNING {_JOB_COLUMNS}"""

# Only this instance's still-active rows: a cancel on a finished job needs no kill.
LIST_CANCEL_REQUESTED = """
SELECT id FROM jobs
WHERE owner_instance = $1 AND status IN ('queued','running')
  AND cancel_requested_at IS NOT NULL
ORDER BY created_at"""

# Partial output only while running and owned: a late flush never touches a terminal row
# or a row that another instance now answers for.
SAVE_PROGRESS = """
UPDATE jobs SET output_bytes = $3, output = $4, stderr_tail = $5, updated_at = now()
WHERE id = $1 AND owner_instance = $2 AND status = 'running'"""

# -- the reaper ---------------------------------------------------------------------------

# A job's lease is the LATER of its own lease_deadline (set when it was admitted and when it
# started) and its owner's instance lease (renewed by every heartbeat). A job is a candidate
# only when both passed on the database clock (plus the grace for http jobs); an owner whose
# row is gone (collected) holds no lease. Never because another instance started.
# `lease_deadline < now()` first, so the range scan on jobs_status_lease_deadline does the
# work; the owner is one primary-key probe per row.
_LEASE_EXPIRED = """
status IN ('queued','running') AND lease_deadline < now()
  AND (transport <> 'http' OR lease_deadline + make_interval(secs => $1) < now())
  AND NOT EXISTS (
      SELECT 1 FROM gateway_instances AS owner
      WHERE owner.instance_id = jobs.owner_instance
        AND owner.lease_expires_at + CASE WHEN jobs.transport = 'http'
                                          THEN make_interval(secs => $1)
                                          ELSE interval '0' END >= now())"""

LIST_EXPIRED_CANDIDATES = f"""
SELECT {_JOB_COLUMNS} FROM jobs WHERE {_LEASE_EXPIRED}
ORDER BY lease_deadline"""

# Taken first in the reaper's transaction: the rows of lapsed owners that still own active
# jobs, locked (in a fixed order: two reapers never deadlock). While they are held no
# heartbeat of those owners can commit, and owners live at this moment stay live for the
# whole transaction (now() is its start time, a lease only grows). So the UPDATE below,
# whose NOT EXISTS reads a later snapshot, can never orphan a job whose owner renewed in
# between: its lease had lapsed when we judged it, or it is not touched.
LOCK_EXPIRED_OWNERS = """
SELECT instance_id FROM gateway_instances AS owner
WHERE lease_expires_at < now()
  AND EXISTS (SELECT 1 FROM jobs WHERE jobs.owner_instance = owner.instance_id
                                   AND jobs.status IN ('queued','running'))
ORDER BY instance_id
FOR UPDATE"""

# The same predicate, re-checked inside the UPDATE (no select-then-flip); a row a completion
# or cancel changed first is re-evaluated on its committed version. Rows proven alive by the
# reaper's probe ($2) are spared.
RECOVER_EXPIRED_LEASES = f"""
UPDATE jobs SET status = 'orphaned', error = COALESCE(error, $3),
                error_kind = 'orphaned', finished_at = now(), updated_at = now(),
                lease_deadline = NULL
WHERE {_LEASE_EXPIRED}
  AND NOT (id = ANY($2::text[]))
RETURNING {_JOB_COLUMNS}"""

# -- retention and reads ------------------------------------------------------------------

# Only terminal rows past retention; an active row is never deleted, whatever its age.
PURGE_TERMINAL = """
DELETE FROM jobs
WHERE status IN ('completed','failed','cancelled','timed_out','orphaned')
  AND finished_at < now() - make_interval(secs => $1)
RETURNING id"""

# A plain read; every caller that acts on it goes through a guarded UPDATE afterwards.
GET_JOB = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = $1"

# The light read (status, wait, list, cancel): the output stays on the server and the parsed
# result loses its `text` there (each can be max_output_bytes; those reads need neither).
# `json`, not `jsonb`: jsonb refuses the \u0000 escape a CLI's output can hold.
_LIGHT_JOB_COLUMNS = ", ".join(
    "NULL::text AS output" if name == "output"
    else ("CASE WHEN json_typeof(result_json::json) = 'object' THEN "
          "(SELECT COALESCE(json_object_agg(key, value), '{}'::json)::text "
          "FROM json_each(result_json::json) WHERE key <> 'text') "
          "ELSE result_json END AS result_json") if name == "result_json"
    else name
    for name in JobRow.column_names())

GET_JOB_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs WHERE id = $1"
# Admission's dedup lookup and a cancel's answer read light rows too: a duplicate of (or a
# cancel for) a finished job with a large output must not load that output.
FIND_REUSABLE_LIGHT = FIND_REUSABLE.replace(f"SELECT {_JOB_COLUMNS}",
                                            f"SELECT {_LIGHT_JOB_COLUMNS}", 1)
REQUEST_CANCEL_LIGHT = REQUEST_CANCEL.replace(f"RETURNING {_JOB_COLUMNS}",
                                              f"RETURNING {_LIGHT_JOB_COLUMNS}", 1)

# Optional filters as NULL-able parameters keep one statement text (one prepared plan).
_LIST_JOBS_FILTERS = """
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::text IS NULL OR provider = $2)
  AND ($3::text IS NULL OR owner_instance = $3)
ORDER BY created_at DESC, id DESC
LIMIT $4"""
LIST_JOBS = f"SELECT {_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"
LIST_JOBS_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"

# A page of the output, or of the parsed answer ($4), cut on the server: only the page
# crosses the wire. The answer is result_json's `text` when it is a non-empty string, else the
# range of the output its `text_span` names (see base.answer_in), else the output. As bytea
# (UTF-8), substring and octet_length count bytes. OFFSET 0 keeps the subquery whole: the
# value is built once.
READ_OUTPUT = """
SELECT substring(data FROM $2 FOR $3), octet_length(data) FROM (
    SELECT CASE
        WHEN answer.text IS NOT NULL THEN convert_to(answer.text, 'UTF8')
        WHEN answer.span_start >= 0 AND answer.span_end > answer.span_start
        THEN substring(convert_to(COALESCE(jobs.output, ''), 'UTF8')
                       FROM answer.span_start + 1 FOR answer.span_end - answer.span_start)
        ELSE convert_to(COALESCE(jobs.output, ''), 'UTF8') END AS data
    FROM jobs, LATERAL (
        SELECT CASE WHEN json_typeof(parsed -> 'text') = 'string' AND parsed ->> 'text' <> ''
                    THEN parsed ->> 'text' END AS text,
               CASE WHEN json_typeof(parsed -> 'text_span' -> 1) = 'number'
                    THEN (parsed -> 'text_span' ->> 0)::integer END AS span_start,
               CASE WHEN json_typeof(parsed -> 'text_span' -> 1) = 'number'
                    THEN (parsed -> 'text_span' ->> 1)::integer END AS span_end
        FROM (SELECT CASE WHEN $4 AND json_typeof(jobs.result_json::json) = 'object'
                          THEN jobs.result_json::json END AS parsed) AS result
    ) AS answer
    WHERE jobs.id = $1 OFFSET 0) AS source"""

# For the rare answer READ_OUTPUT cannot unescape (a \u0000 in it): paged in Python.
READ_RESULT_JSON = "SELECT result_json FROM jobs WHERE id = $1"

# What the light and paged reads cannot parse (result_json is only ever written by
# complete(), as canonical JSON, so only a row written by hand): handled in Python.
_JSON_ERRORS = (asyncpg.InvalidTextRepresentationError, asyncpg.UntranslatableCharacterError)

# The database clock as epoch seconds: the one clock every instance agrees on.
READ_NOW = "SELECT EXTRACT(EPOCH FROM now())::float8"


# -- errors -------------------------------------------------------------------------------

# Failures that mean "the store cannot be reached or refused the statement right now":
# connection lost/refused (class 08), server shutting down or a statement cancelled by
# timeout (57), out of resources or disk (53), lock timeout (55P03), serialization or
# deadlock (40), read-only standby after a failover (25006), bad credentials or unknown
# database (28, 3D), client-side connection state, OS and timeout errors. Everything else
# (syntax, constraint) is a bug and propagates unchanged.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.LockNotAvailableError,
    asyncpg.TransactionRollbackError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,  # includes ConnectionRefusedError, ConnectionResetError
    TimeoutError,  # asyncio.TimeoutError is TimeoutError on 3.11
    EOFError,
)


def _secrets_of(dsn: str) -> list[str]:
    """The DSN's password (raw and percent-decoded) so error text can be scrubbed of it."""
    try:
        password = urlsplit(dsn).password
    except ValueError:
        password = None
    secrets = [dsn]
    if password:
        secrets.extend({password, unquote(password)})
    return [s for s in secrets if s]


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced by `***` (for logs and error messages)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable dsn>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _status_count(status: str) -> int:
    """Rows affected, from a command tag such as `UPDATE 3` or `DELETE 0`."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


def _job(row: asyncpg.Record) -> JobRow:
    return JobRow.from_mapping(row)


async def _output_pieces(source: OutputFile) -> AsyncIterator[tuple[int, str]]:
    """(seq, text) rows of a large output for COPY, each piece read in a thread: file reads
    stay off the event loop, and one piece at a time is held."""
    pieces = source.text_chunks()
    try:
        seq = 0
        while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
            yield seq, piece
            seq += 1
    finally:
        pieces.close()


def _instance(row: asyncpg.Record) -> InstanceRow:
    return InstanceRow(**dict(row.items()))


class PostgresJobStore:
    """JobStore on a PostgreSQL database shared by any number of gateway instances."""

    backend = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self._dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._secrets = _secrets_of(dsn)
        self._pool: asyncpg.Pool | None = None

    def __repr__(self) -> str:
        return f"PostgresJobStore({redact_dsn(self._dsn)!r})"

    # -- errors and connections -----------------------------------------------------------
    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _unavailable(self, action: str, exc: BaseException) -> StoreUnavailable:
        detail = self._scrub(str(exc)) or type(exc).__name__
        return StoreUnavailable(
            f"postgres store: {action} failed ({type(exc).__name__}: {detail})"
        )

    @asynccontextmanager
    async def _connection(self, action: str) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; connection-level failures become StoreUnavailable.

        The cause is not chained (`from None`): asyncpg's exception objects can carry the
        connection parameters, and a traceback must not show them.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"postgres store: {action} failed (store is not open)")
        try:
            async with pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn:
                yield conn
        except _UNAVAILABLE_ERRORS as exc:
            raise self._unavailable(action, exc) from None

    @asynccontextmanager
    async def _transaction(self, action: str) -> AsyncIterator[asyncpg.Connection]:
        async with self._connection(action) as conn, conn.transaction():
            yield conn

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self) -> None:
        """Create the pool and create/migrate the schema under an advisory lock.

        Raises StoreUnavailable when the server cannot be reached, refuses the credentials,
        or holds a schema written by a newer gateway.
        """
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=CONNECT_TIMEOUT_S,
                command_timeout=COMMAND_TIMEOUT_S,
                server_settings={
                    "application_name": APPLICATION_NAME,
                    "lock_timeout": str(LOCK_TIMEOUT_MS),
                },
            )
        except (*_UNAVAILABLE_ERRORS, ValueError, asyncpg.ClientConfigurationError) as exc:
            raise self._unavailable("open", exc) from None
        self._pool = pool
        try:
            await self._migrate()
        except BaseException:
            self._pool = None
            pool.terminate()
            raise

    async def _migrate(self) -> None:
        async with self._transaction("migrate schema") as conn:
            await conn.execute(LOCK_SCHEMA)
            await conn.execute(CREATE_SCHEMA_VERSION_TABLE)
            current = int(await conn.fetchval(READ_SCHEMA_VERSION))
            if current > SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"postgres store: the database schema is version {current}, newer than "
                    f"this gateway understands ({SCHEMA_VERSION}); upgrade agent-cli-gateway"
                )
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(RECORD_SCHEMA_VERSION, version)
                log.info("schema migrated", action="migrate_schema", version=version)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_S)
        except _UNAVAILABLE_ERRORS as exc:  # dead server or stuck borrower: do not hang
            log.warning(
                "postgres pool did not close cleanly; terminating",
                action="close_store", error=type(exc).__name__,
            )
            pool.terminate()

    async def schema_version(self) -> int:
        async with self._connection("read schema version") as conn:
            return int(await conn.fetchval(READ_SCHEMA_VERSION))

    async def now(self) -> float:
        async with self._connection("read clock") as conn:
            return float(await conn.fetchval(READ_NOW))

    # -- instances ------------------------------------------------------------------------
    async def register_instance(self, instance: InstanceRow, ttl_s: float) -> None:
        """Upsert the instance row. started_at, heartbeat_at and the lease come from the
        database clock (the row's own started_at is ignored: no client time is stored)."""
        async with self._connection("register instance") as conn:
            await conn.execute(
                UPSERT_INSTANCE,
                instance.instance_id, instance.hostname, instance.boot_id, instance.pid,
                instance.pid_started_at, instance.role, instance.version, float(ttl_s),
            )

    async def mark_instance_stopped(self, instance_id: str) -> None:
        async with self._connection("mark instance stopped") as conn:
            await conn.execute(MARK_INSTANCE_STOPPED, instance_id)

    async def heartbeat(self, instance_id: str, ttl_s: float) -> int:
        # One row whatever the job count: the instance lease covers all of its jobs.
        async with self._connection("heartbeat") as conn:
            renewed = await conn.execute(RENEW_INSTANCE_LEASE, instance_id, float(ttl_s))
        return _status_count(renewed)

    async def gc_instances(self, older_than_s: float) -> int:
        async with self._connection("gc instances") as conn:
            return _status_count(await conn.execute(GC_INSTANCES, float(older_than_s)))

    async def list_instances(self) -> list[InstanceRow]:
        async with self._connection("list instances") as conn:
            return [_instance(row) for row in await conn.fetch(LIST_INSTANCES)]

    # -- admission and transitions --------------------------------------------------------
    async def find_reusable(self, request_key: str, dedup_window_s: float) -> JobRow | None:
        async with self._connection("find reusable job") as conn:
            row = await conn.fetchrow(FIND_REUSABLE_LIGHT, request_key, float(dedup_window_s))
        return _job(row) if row is not None else None

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        """Insert a queued row; DuplicateActiveJob if an active twin exists, ValueError if
        the id is taken."""
        async with self._connection("insert job") as conn:
            try:
                row = await conn.fetchrow(
                    INSERT_JOB,
                    job.id, job.provider, job.request_key, job.transport, job.correlation_id,
                    job.owner_instance, float(ttl_s), job.hostname, job.working_dir,
                    job.model, job.session_id, job.request_json, job.forced, job.boot_id,
                )
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name != ACTIVE_INDEX_NAME:
                    raise ValueError(f"job id {job.id} already exists") from None
                existing = await conn.fetchval(FIND_ACTIVE_BY_KEY, job.request_key)
                raise DuplicateActiveJob(existing) from None
        assert row is not None  # INSERT ... RETURNING always returns the row it inserted
        return _job(row)

    async def mark_running(
        self, job_id: str, owner_instance: str, pid: int | None, pgid: int | None,
        pid_started_at: float | None, ttl_s: float,
    ) -> bool:
        async with self._connection("mark running") as conn:
            status = await conn.execute(
                MARK_RUNNING, job_id, owner_instance, pid, pgid, pid_started_at, float(ttl_s)
            )
        return _status_count(status) == 1

    async def record_process(
        self, job_id: str, owner_instance: str, pid: int, pgid: int, pid_started_at: float
    ) -> bool:
        async with self._connection("record process") as conn:
            status = await conn.execute(
                RECORD_PROCESS, job_id, owner_instance, pid, pgid, pid_started_at
            )
        return _status_count(status) == 1

    async def complete(self, job_id: str, owner_instance: str, completion: Completion) -> bool:
        """Guarded terminal write; ValueError if the completion is not a final status."""
        if completion.status not in FINAL_STATUSES:
            raise ValueError(f"a completion cannot be {completion.status!s}")
        output, pieces = output_to_bind(completion.output)
        params = (job_id, owner_instance, completion.status.value, completion.error_kind,
                  completion.error, completion.exit_code, output, completion.stderr_tail,
                  completion.output_bytes, completion.truncated, completion.result_json,
                  CANCELLED_ERROR)
        if pieces is None:
            async with self._connection("complete job") as conn:
                status = await conn.execute(COMPLETE_JOB, *params)
            return _status_count(status) == 1
        # Invariant: the pieces go into a table only this transaction sees; the status and
        # the output are then set by ONE guarded UPDATE, so the compare-and-set is still a
        # single statement and a reader sees the row active, or terminal with its whole
        # output. A write that lost the CAS leaves nothing (the table is dropped at commit).
        async with self._transaction("complete job") as conn:
            await conn.execute(CREATE_OUTPUT_PIECES)
            await conn.copy_records_to_table(
                OUTPUT_PIECES_TABLE, records=_output_pieces(pieces), columns=("seq", "piece"))
            status = await conn.execute(COMPLETE_JOB_FROM_PIECES, *params)
        return _status_count(status) == 1

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
        async with self._connection("save progress") as conn:
            status = await conn.execute(
                SAVE_PROGRESS, job_id, owner_instance, progress.output_bytes, progress.output,
                progress.stderr_tail,
            )
        return _status_count(status) == 1

    # -- the reaper -----------------------------------------------------------------------
    async def list_expired_candidates(self, http_grace_s: float) -> list[JobRow]:
        async with self._connection("list expired leases") as conn:
            rows = await conn.fetch(LIST_EXPIRED_CANDIDATES, float(http_grace_s))
        return [_job(row) for row in rows]

    async def recover_expired_leases(
        self, http_grace_s: float, alive_ids: Collection[str] = ()
    ) -> list[JobRow]:
        async with self._transaction("recover expired leases") as conn:
            await conn.fetch(LOCK_EXPIRED_OWNERS)
            rows = await conn.fetch(
                RECOVER_EXPIRED_LEASES, float(http_grace_s), list(alive_ids), ORPHANED_ERROR
            )
        return [_job(row) for row in rows]

    # -- retention and reads --------------------------------------------------------------
    async def purge_terminal(self, older_than_s: float) -> list[str]:
        async with self._connection("purge terminal jobs") as conn:
            rows = await conn.fetch(PURGE_TERMINAL, float(older_than_s))
        return [row["id"] for row in rows]

    async def get_job(self, job_id: str, *, with_output: bool = True) -> JobRow | None:
        async with self._connection("get job") as conn:
            if with_output:
                row = await conn.fetchrow(GET_JOB, job_id)
                return _job(row) if row is not None else None
            try:
                row = await conn.fetchrow(GET_JOB_LIGHT, job_id)
            except _JSON_ERRORS:
                row = await conn.fetchrow(GET_JOB, job_id)
                return without_output(_job(row)) if row is not None else None
        return _job(row) if row is not None else None

    async def read_output(
        self, job_id: str, offset: int, length: int, *, answer: bool = False
    ) -> tuple[bytes, int] | None:
        start, length = max(offset, 0), max(length, 0)
        async with self._connection("read output") as conn:
            try:
                row = await conn.fetchrow(READ_OUTPUT, job_id, start + 1, length, answer)
            except _JSON_ERRORS:
                where = answer_in(await conn.fetchval(READ_RESULT_JSON, job_id)) if answer else None
                if isinstance(where, str):
                    return page_of(where.encode("utf-8"), start, length)
                first, last = where or (0, None)
                at = first + start if last is None else first + min(start, last - first)
                want = length if last is None else max(0, min(length, last - at))
                row = await conn.fetchrow(READ_OUTPUT, job_id, at + 1, want, False)
                if row is not None and last is not None:
                    size = int(row[1] or 0)
                    return bytes(row[0] or b""), max(0, min(last, size) - min(first, size))
        if row is None:
            return None
        return bytes(row[0] or b""), int(row[1] or 0)

    async def list_jobs(
        self, *, statuses: Sequence[JobStatus] | None = None, provider: str | None = None,
        owner_instance: str | None = None, limit: int = 50, with_output: bool = True,
    ) -> list[JobRow]:
        wanted: list[str] | None = (
            [JobStatus(s).value for s in statuses] if statuses is not None else None
        )
        params = (wanted, provider, owner_instance, max(limit, 0))
        async with self._connection("list jobs") as conn:
            if with_output:
                return [_job(row) for row in await conn.fetch(LIST_JOBS, *params)]
            try:
                rows = await conn.fetch(LIST_JOBS_LIGHT, *params)
            except _JSON_ERRORS:
                return [without_output(_job(row)) for row in await conn.fetch(LIST_JOBS, *params)]
        return [_job(row) for row in rows]
