"""Every SQL statement of the PostgreSQL backend, each named after what it does.

The executor (`store.py`) runs them; the invariant each state transition protects is
written beside its statement, in its WHERE clause.
"""

from __future__ import annotations

import asyncpg

from gateway.model import (
    JobRow,
)
from gateway.store.base import (
    ACTIVE_STATUSES_SQL,
    NEW_JOB_COLUMNS,
    REAPER_COLUMNS,
    SCHEMA_VERSION,
)
from gateway.store.owner_columns import INSTANCE_COLUMN_LIST, OWNER_COLUMN_LIST
from gateway.store.postgres import workers as postgres_workers
from gateway.store.postgres.attempts import ATTEMPTS_SCHEMA
from gateway.store.postgres.meta import SCHEMA_V7
from gateway.store.postgres.notices import NOTIFY_SCHEMA
from gateway.store.postgres.outbox import OUTBOX_SCHEMA
from gateway.store.postgres.sweeps import SWEEPS_SCHEMA
from gateway.store.postgres.usage import SCHEMA_V5
from gateway.store.postgres.workers import SCHEMA_V11, SCHEMA_V14

ACTIVE_INDEX_NAME = "jobs_active_request_key"

_JOB_COLUMNS = ", ".join(JobRow.column_names())
_REAPER_COLUMNS = ", ".join(REAPER_COLUMNS)
_NEW_JOB_COLUMNS = ", ".join(NEW_JOB_COLUMNS)

# -- schema -------------------------------------------------------------------------------

# pg_advisory_xact_lock key that serializes schema migration between instances starting at
# once: the ASCII bytes of "acg_schm" read as a bigint (positive, fits int8).
SCHEMA_LOCK_KEY = int.from_bytes(b"acg_schm", "big")

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

# Read-only inspection (doctor, the reading CLI commands): is there a version table at all?
HAS_SCHEMA_VERSION_TABLE = """
SELECT EXISTS (SELECT 1 FROM information_schema.tables
               WHERE table_schema = current_schema() AND table_name = 'schema_version')"""

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
        ON jobs (request_key) WHERE status IN {ACTIVE_STATUSES_SQL} AND NOT forced""",
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
# v3: `requeued_at` (a job queued again after its owner left it unstarted: at most once).
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, _SCHEMA_V1), (2, ()),
    (3, ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS requeued_at timestamptz",)),
    # v4: `principal` (who made the job; NULL for the rows before).
    (4, ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS principal text",)),
    (5, SCHEMA_V5),  # usage totals and budgets (usage.py)
    # v6: the bounded uncharged re-queues (how many, why) and which host orphaned a job.
    (6, ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS requeue_count integer NOT NULL DEFAULT 0",
         "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS requeue_reasons text",
         "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS orphaned_by text")),
    (7, SCHEMA_V7),  # the lowest writer and the renewal wait (meta.py)
    # v8: one sweeper per interval and fillfactor (sweeps.py), notices of status
    # and cancel changes (notices.py).
    (8, (*SWEEPS_SCHEMA, *NOTIFY_SCHEMA)),
    (11, SCHEMA_V11),  # worker hosts (workers.py)
    (12, ATTEMPTS_SCHEMA),  # attempt groups (attempts.py)
    (13, OUTBOX_SCHEMA),  # completion notices (outbox.py)
    (14, SCHEMA_V14),  # worktree jobs' patches of worker hosts (workers.py)
    # v15: when a gateway last adopted the job (the dashboard's timeline).
    (15, ("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS adopted_at timestamptz",)))
assert MIGRATIONS[-1][0] == SCHEMA_VERSION, "add a migration when SCHEMA_VERSION changes"

# -- instances ----------------------------------------------------------------------------

# Upsert: a re-registering instance (after a heartbeat outage) keeps its first started_at
# and is alive again (stopped_at cleared); its lease restarts from the database's now().
UPSERT_INSTANCE = f"""
INSERT INTO gateway_instances ({INSTANCE_COLUMN_LIST})
VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now(), now() + make_interval(secs => $8), NULL,
        NULL, $9)
ON CONFLICT (instance_id) DO UPDATE SET
    hostname = excluded.hostname, boot_id = excluded.boot_id, pid = excluded.pid,
    pid_started_at = excluded.pid_started_at, role = excluded.role,
    version = excluded.version, heartbeat_at = excluded.heartbeat_at,
    capabilities = COALESCE(excluded.capabilities, gateway_instances.capabilities),
    lease_expires_at = excluded.lease_expires_at, stopped_at = NULL"""

# Only the first stop counts: the row records when the instance really went away.
MARK_INSTANCE_STOPPED = """
UPDATE gateway_instances SET stopped_at = now()
WHERE instance_id = $1 AND stopped_at IS NULL"""

# Renews exactly one instance row (the caller's own). This row IS the lease of every job the
# instance owns (the reaper reads it), so a heartbeat costs one row whatever the job count.
# It waits while a reaper holds this row locked (LOCK_EXPIRED_OWNERS), then renews a lease
# that had lapsed: the owner then finds its jobs orphaned and self-heals at completion.
# The worst renewal wait of the last hour rides along ($3 NULL: none measured yet).
RENEW_INSTANCE_LEASE = """
UPDATE gateway_instances
SET heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => $2),
    renewal_wait_ms_max_1h = COALESCE($3::double precision, renewal_wait_ms_max_1h)
WHERE instance_id = $1"""

# Only rows stopped, or whose lease expired, more than the threshold ago: a live instance's
# row (lease in the future) is never collected.
# A lapsed row is collected only by a gateway of its host that found its pid dead ($3
# lists the live ones): a collected row is then proof that its owner is gone (issue 23).
GC_INSTANCES = """
DELETE FROM gateway_instances
WHERE (stopped_at IS NOT NULL AND stopped_at < now() - make_interval(secs => $1))
   OR (lease_expires_at < now() - make_interval(secs => $1)
       AND ($2::text IS NULL OR hostname = $2::text)
       AND NOT (instance_id = ANY($3::text[])))"""

LIST_INSTANCES = f"""
SELECT {INSTANCE_COLUMN_LIST} FROM gateway_instances ORDER BY started_at, instance_id"""

# -- admission and transitions ------------------------------------------------------------

# Reuse only non-forced rows that are active (any age) or completed within the window
# measured from finished_at on the database clock; failed/cancelled/timed_out/orphaned
# never match.
FIND_REUSABLE = f"""
SELECT {_JOB_COLUMNS} FROM jobs
WHERE request_key = $1 AND NOT forced
  AND (status IN {ACTIVE_STATUSES_SQL}
       OR (status = 'completed' AND finished_at >= now() - make_interval(secs => $2)))
ORDER BY created_at DESC, id DESC
LIMIT 1"""

# A plain INSERT: the partial unique index jobs_active_request_key is the arbiter. Two
# instances racing with the same non-forced key: the second INSERT waits for the first
# transaction and then fails with a unique violation (mapped to DuplicateActiveJob).
INSERT_JOB = f"""
INSERT INTO jobs ({_NEW_JOB_COLUMNS}, runs_on)
VALUES ($1, $2, CASE WHEN $16 THEN 'running' ELSE 'queued' END, $3, $4, $5,
        $6, now() + make_interval(secs => $7), $8, $9, $10, $11,
        $12, now(), now(), $13, $14, $15, CASE WHEN $16 THEN now() END, $17)
RETURNING {_JOB_COLUMNS}"""

# The one active, non-forced row the index let win (NULL if it finished meanwhile).
FIND_ACTIVE_BY_KEY = f"""
SELECT id FROM jobs
WHERE request_key = $1 AND NOT forced AND status IN {ACTIVE_STATUSES_SQL}
LIMIT 1"""

# queued -> running only for the owner: a row orphaned or cancelled while it waited in the
# queue never starts (the manager spawns only after this returns true).
MARK_RUNNING = """
UPDATE jobs SET status = 'running', started_at = now(), updated_at = now(),
                lease_deadline = now() + make_interval(secs => $3)
WHERE id = $1 AND owner_instance = $2 AND status = 'queued'"""

# A process identity is stamped only on a running row this instance still owns.
RECORD_PROCESS = """
UPDATE jobs SET pid = $3, pgid = $4, pid_started_at = $5, updated_at = now()
WHERE id = $1 AND owner_instance = $2 AND status = 'running'"""

# Guarded terminal write, by the row's owner only: an active row, or a row orphaned from
# another host (the self-heal of a stale owner that revived: nobody on its host could prove
# it gone); every other terminal row is final, an orphaning on the job's own host too (a
# poller that read `orphaned` stopped polling: the state it saw must stay true). The owner
# test matters once jobs change hands: a job adopted or re-queued while its first owner was
# stopped may be a different run by now (re-queued: a new launch in a new spool), and a
# stale owner waking up must not end it with what it saw of the old one. Every taker CASes
# owner_instance to itself before it writes. A cancel request on the row turns any outcome
# into `cancelled` (cancelled wins over a late completion).
_COMPLETE_JOB = f"""
UPDATE jobs SET
    status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE $3 END,
    error_kind = CASE WHEN cancel_requested_at IS NOT NULL AND $3 <> 'cancelled'
                      THEN 'cancelled' ELSE $4 END,
    error = CASE WHEN cancel_requested_at IS NOT NULL AND $3 <> 'cancelled'
                 THEN COALESCE($5, $12) ELSE $5 END,
    exit_code = $6, output = {{output}}, stderr_tail = $8,
    output_bytes = $9, truncated = $10, result_json = $11,
    finished_at = LEAST(COALESCE(to_timestamp($13::float8), now()), now()),
    updated_at = now(), lease_deadline = NULL
WHERE id = $1 AND owner_instance = $2
  AND (status IN {ACTIVE_STATUSES_SQL}
       OR (status = 'orphaned' AND orphaned_by IS DISTINCT FROM hostname))"""
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
WHERE id = $1 AND status IN {ACTIVE_STATUSES_SQL} AND cancel_requested_at IS NULL
RETURNING {_JOB_COLUMNS}"""

# Only this instance's still-active rows: a cancel on a finished job needs no kill.
LIST_CANCEL_REQUESTED = f"""
SELECT id FROM jobs
WHERE owner_instance = $1 AND status IN {ACTIVE_STATUSES_SQL}
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
_LEASE_EXPIRED = f"""
status IN {ACTIVE_STATUSES_SQL} AND lease_deadline < now()
  AND (transport <> 'http' OR lease_deadline + make_interval(secs => $1) < now())
  AND NOT EXISTS (
      SELECT 1 FROM gateway_instances AS owner
      WHERE owner.instance_id = jobs.owner_instance
        AND owner.lease_expires_at + CASE WHEN jobs.transport = 'http'
                                          THEN make_interval(secs => $1)
                                          ELSE interval '0' END >= now())"""

# The reaper's alternative for a remote job that never started (workers.py): $5 is the
# http grace there.
RETURN_TO_POOL = postgres_workers.RETURN_TO_POOL.replace(
    "{lease_expired}", _LEASE_EXPIRED.replace("$1", "$5"))

# Narrow and bounded (base.REAPER_COLUMNS, $2 rows, oldest lease first): a sweep never
# reads requests or outputs, and its cost does not grow with a backlog.
LIST_EXPIRED_CANDIDATES = f"""
SELECT {_REAPER_COLUMNS} FROM jobs WHERE {_LEASE_EXPIRED}
ORDER BY lease_deadline
LIMIT $2"""

# Taken first in the reaper's transaction: the rows of lapsed owners that still own active
# jobs, locked (in a fixed order: two reapers never deadlock). While they are held no
# heartbeat of those owners can commit, and owners live at this moment stay live for the
# whole transaction (now() is its start time, a lease only grows). So the UPDATE below,
# whose NOT EXISTS reads a later snapshot, can never orphan a job whose owner renewed in
# between: its lease had lapsed when we judged it, or it is not touched. SKIP LOCKED: an
# owner row another transaction holds (its heartbeat, another reaper, a stalled peer) is
# left for the next sweep instead of stalling this one; its jobs are not judged now.
LOCK_EXPIRED_OWNERS = f"""
SELECT instance_id FROM gateway_instances AS owner
WHERE lease_expires_at < now()
  AND EXISTS (SELECT 1 FROM jobs WHERE jobs.owner_instance = owner.instance_id
                                   AND jobs.status IN {ACTIVE_STATUSES_SQL})
ORDER BY instance_id
FOR UPDATE SKIP LOCKED"""

# The same predicate, re-checked when each row is locked (no select-then-flip; a row a
# completion or cancel changed first is re-evaluated on its committed version), and only on
# the candidates the reaper listed and judged ($2, without the ones its probe proved alive):
# a job that lapsed after the listing was never probed, so it waits for the next sweep. Only
# jobs whose owner this transaction locked ($4) or whose owner has no row: a skipped owner's
# jobs are not judged. SKIP LOCKED: a job row another transaction holds (a stalled peer's
# completion) is left for the next sweep, so one row cannot block the rest.
RECOVER_EXPIRED_LEASES = f"""
UPDATE jobs SET status = 'orphaned', error = COALESCE(error, $3),
                error_kind = 'orphaned', finished_at = now(), updated_at = now(),
                lease_deadline = NULL, orphaned_by = $5
WHERE id IN (
    SELECT id FROM jobs
    WHERE id = ANY($2::text[]) AND {_LEASE_EXPIRED}
      AND (owner_instance = ANY($4::text[])
           OR NOT EXISTS (SELECT 1 FROM gateway_instances AS known
                          WHERE known.instance_id = jobs.owner_instance))
    FOR UPDATE SKIP LOCKED)
RETURNING {_REAPER_COLUMNS}"""

# -- retention and reads ------------------------------------------------------------------

# Only terminal rows past retention; an active row is never deleted, whatever its age.
# One batch of retention: any $2 rows past it, read off jobs_status_finished's ranges (no
# ORDER BY: ordering five status ranges by finish time sorted the whole backlog per batch,
# 3 s each over a million rows). SKIP LOCKED: a row some statement holds (a self-heal racing
# retention) waits for the next pass instead of making the batch wait.
PURGE_TERMINAL = """
DELETE FROM jobs WHERE id IN (
  SELECT id FROM jobs
  WHERE status IN ('completed','failed','cancelled','timed_out','orphaned')
    AND finished_at < now() - make_interval(secs => $1)
  LIMIT $2
  FOR UPDATE SKIP LOCKED)
RETURNING id"""

# A plain read; every caller that acts on it goes through a guarded UPDATE afterwards.
GET_JOB = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = $1"

# Ids starting with $1 (a like_prefix pattern: the caller's wildcards escaped; PostgreSQL's
# LIKE is case-sensitive). Bounded by $2.
FIND_JOB_IDS = r"""
SELECT id FROM jobs WHERE id LIKE $1 ESCAPE '\' ORDER BY id LIMIT $2"""

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
# The principal filter is in the query, before LIMIT, so a caller's page is full whenever it
# has that many jobs (#23): $6 adds the rows from before schema 4 (no principal).
_LIST_JOBS_FILTERS = """
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::text IS NULL OR provider = $2)
  AND ($3::text IS NULL OR owner_instance = $3)
  AND ($5::text IS NULL OR principal = $5 OR ($6::boolean AND principal IS NULL))
ORDER BY created_at DESC, id DESC
LIMIT $4"""
LIST_JOBS = f"SELECT {_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"
LIST_JOBS_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"

# The dashboard's page (base.JobsPage): the keyset is the previous page's last row, read by
# its id; a cursor whose row is gone yields an empty page, never the table from its start.
_JOBS_PAGE_FILTERS = """
WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
  AND ($2::text IS NULL OR provider = $2)
  AND ($3::text IS NULL OR hostname = $3)
  AND ($4::text IS NULL
       OR (created_at, id) < (SELECT created_at, id FROM jobs WHERE id = $4))
ORDER BY created_at DESC, id DESC
LIMIT $5"""
LIST_JOBS_PAGE = f"SELECT {_JOB_COLUMNS} FROM jobs{_JOBS_PAGE_FILTERS}"
LIST_JOBS_PAGE_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs{_JOBS_PAGE_FILTERS}"

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

# doctor: the gateways' server connections ($1: their application_name; not this one),
# all client connections, and the server's limit (a read of pg_stat_activity; no write).
READ_CONNECTION_USAGE = """
SELECT count(*) FILTER (WHERE application_name = $1
                        AND pid <> pg_backend_pid()) AS gateway_connections,
       count(*) FILTER (WHERE backend_type = 'client backend') AS client_connections,
       current_setting('max_connections')::int AS max_connections
FROM pg_stat_activity"""



# -- detach, adoption, re-queue (docs/architecture.md) --------------------------------------

# Detach: each named RUNNING job of this instance ($1) gets lease_deadline = now() + its
# seconds ($2 ids, $3 seconds), never an earlier deadline than it had: until then its
# supervisor may still be running it, and no gateway on any host may orphan it.
EXTEND_LEASES = """
UPDATE jobs SET lease_deadline = GREATEST(COALESCE(jobs.lease_deadline, now()),
                                          now() + make_interval(secs => d.secs)),
                updated_at = now()
FROM unnest($2::text[], $3::float8[]) AS d(id, secs)
WHERE jobs.id = d.id AND jobs.owner_instance = $1 AND jobs.status = 'running'"""

# What an adopter may take over (the caller probes an owner on this host for a live pid):
# jobs of this host ($2) owned by another instance ($1) whose row is stopped, collected, or
# on this host and boot ($3). Active ones only: `orphaned` is final (no adopter heals or
# re-queues it). A running http job waits until its own lease passed: a detaching owner
# drains it until then. At most $4: jobs whose owner is collected, stopped or lapsed first,
# then the oldest (see sqlite/sql.py).
_CANDIDATE_COLUMNS = ", ".join(
    f"NULL AS {name}" if name in ("output", "result_json") else f"jobs.{name} AS {name}"
    for name in JobRow.column_names())
LIST_ADOPTION_CANDIDATES = f"""
SELECT {_CANDIDATE_COLUMNS},
       {OWNER_COLUMN_LIST}
FROM jobs LEFT JOIN gateway_instances AS owner ON owner.instance_id = jobs.owner_instance
WHERE jobs.hostname = $2 AND jobs.owner_instance IS DISTINCT FROM $1
  AND jobs.status IN {ACTIVE_STATUSES_SQL}
  AND NOT (jobs.transport = 'http' AND jobs.status = 'running'
           AND jobs.lease_deadline >= now())
  AND (owner.instance_id IS NULL OR owner.stopped_at IS NOT NULL
       OR (owner.hostname = $2 AND owner.boot_id = $3))
ORDER BY CASE WHEN owner.instance_id IS NULL OR owner.stopped_at IS NOT NULL
                   OR owner.lease_expires_at < now() THEN 0 ELSE 1 END,
         jobs.created_at, jobs.id
LIMIT $4"""

# Adoption: one compare-and-set on owner_instance, from the owner the adopter read ($2), so
# of any number of gateways adopting at once exactly one wins (the others' UPDATE re-reads
# the committed row and no longer matches). Only a job of this host ($5); a running one only
# of this boot ($6). The status stays: an orphaned row is healed by the adopter's complete().
# The winner stamps adopted_at (the job page's timeline); a losing CAS writes nothing.
ADOPT_JOB = f"""
UPDATE jobs SET owner_instance = $4, updated_at = now(), adopted_at = now(),
                lease_deadline = CASE WHEN status IN {ACTIVE_STATUSES_SQL}
                                      THEN GREATEST(COALESCE(lease_deadline, now()),
                                                    now() + make_interval(secs => $7)) END
WHERE id = $1 AND owner_instance IS NOT DISTINCT FROM $2 AND status = $3
  AND status IN ('queued','running','orphaned') AND hostname = $5
  AND (status <> 'running' OR boot_id = $6)
RETURNING {_LIGHT_JOB_COLUMNS}"""

# Re-queue of work that never ran: the same CAS on owner_instance (one winner), never a job
# with a cancel request, and never beside an active non-forced twin (the dedup index stays
# exactly-once). That it never started is the caller's proof (the row was queued, or its
# spool's start record was claimed for the re-queue, so no supervisor can ever run it): a
# run is launched at most once however often its job is queued again, and each re-queue
# needs an owner proven gone, so their number is bounded by real gateway deaths. Only a
# HTTP call that started (it may have reached the API, and been billed) is retried at most
# once: requeued_at IS NULL, then stamped. A remote job (runs_on) goes back to the pool:
# its claim is cleared, so any worker that meets it may claim it again.
REQUEUE_JOB = f"""
UPDATE jobs SET status = 'queued', owner_instance = $4, boot_id = $6, claimed_at = NULL,
                requeued_at = now(), lease_deadline = now() + make_interval(secs => $7),
                requeue_count = requeue_count + 1,
                requeue_reasons = COALESCE($8::text, requeue_reasons),
                updated_at = now(), started_at = NULL, finished_at = NULL, pid = NULL,
                pgid = NULL, pid_started_at = NULL, exit_code = NULL, error = NULL,
                error_kind = NULL, output = NULL, output_bytes = 0, stderr_tail = NULL,
                truncated = false
WHERE id = $1 AND owner_instance IS NOT DISTINCT FROM $2 AND status = $3
  AND status IN ('queued','running','orphaned') AND hostname = $5
  AND cancel_requested_at IS NULL
  AND (requeued_at IS NULL OR transport <> 'http' OR started_at IS NULL)
  AND (forced OR NOT EXISTS (
      SELECT 1 FROM jobs AS twin
      WHERE twin.request_key = jobs.request_key AND twin.id <> jobs.id AND NOT twin.forced
        AND twin.status IN {ACTIVE_STATUSES_SQL}))
RETURNING {_LIGHT_JOB_COLUMNS}"""
