"""Every SQL statement of the SQLite backend, each named after what it does.

The executor (`store.py`) runs them; the invariant each state transition protects is
written beside its statement, in its WHERE clause.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from gateway.store.sqlite.attempts import ATTEMPTS_SCHEMA
from gateway.store.sqlite.meta import SCHEMA_V7
from gateway.store.sqlite.outbox import OUTBOX_SCHEMA
from gateway.store.sqlite.sweeps import SWEEPS_SCHEMA
from gateway.store.sqlite.usage import SCHEMA_V5

_JOB_COLUMNS = ", ".join(JobRow.column_names())
_REAPER_COLUMNS = ", ".join(REAPER_COLUMNS)
_NEW_JOB_COLUMNS = ", ".join(NEW_JOB_COLUMNS)
_JOB_TIME_FIELDS = (
    "lease_deadline", "created_at", "started_at", "finished_at", "updated_at",
    "cancel_requested_at", "requeued_at", "claimed_at", "adopted_at",
)
_INSTANCE_TIME_FIELDS = ("started_at", "heartbeat_at", "lease_expires_at", "stopped_at")

# -- schema -------------------------------------------------------------------------------

CREATE_SCHEMA_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at REAL NOT NULL
)"""

READ_SCHEMA_VERSION = "SELECT COALESCE(MAX(version), 0) FROM schema_version"

RECORD_SCHEMA_VERSION = "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"

# The jobs table's columns, in their v1 order (v2 moves `output` last).
_JOB_COLUMN_DEFS: tuple[tuple[str, str], ...] = (
    ("id", "TEXT PRIMARY KEY"),
    ("provider", "TEXT NOT NULL"),
    ("status", "TEXT NOT NULL CHECK (status IN ('queued','running','completed','failed',"
               "'cancelled','timed_out','orphaned'))"),
    ("request_key", "TEXT NOT NULL"),
    ("correlation_id", "TEXT"),
    ("transport", "TEXT NOT NULL DEFAULT 'process' CHECK (transport IN ('process','http'))"),
    ("owner_instance", "TEXT"),
    ("lease_deadline", "REAL"),
    ("hostname", "TEXT"),
    ("pid", "INTEGER"),
    ("pgid", "INTEGER"),
    ("pid_started_at", "REAL"),
    ("working_dir", "TEXT"),
    ("model", "TEXT"),
    ("session_id", "TEXT"),
    ("request_json", "TEXT NOT NULL DEFAULT '{}'"),
    ("created_at", "REAL NOT NULL"),
    ("started_at", "REAL"),
    ("finished_at", "REAL"),
    ("updated_at", "REAL NOT NULL"),
    ("exit_code", "INTEGER"),
    ("error", "TEXT"),
    ("error_kind", "TEXT"),
    ("output", "TEXT"),
    ("stderr_tail", "TEXT"),
    ("output_bytes", "INTEGER NOT NULL DEFAULT 0"),
    ("truncated", "INTEGER NOT NULL DEFAULT 0"),
    ("result_json", "TEXT"),
    ("cancel_requested_at", "REAL"),
    ("forced", "INTEGER NOT NULL DEFAULT 0"),
    ("boot_id", "TEXT"),
)


def _create_jobs_table(name: str, columns: Sequence[tuple[str, str]]) -> str:
    body = ",\n".join(f"    {column:<19} {definition}" for column, definition in columns)
    return f"CREATE TABLE IF NOT EXISTS {name} (\n{body}\n)"


_SCHEMA_V1 = (
    _create_jobs_table("jobs", _JOB_COLUMN_DEFS),
    """
    CREATE TABLE IF NOT EXISTS gateway_instances (
        instance_id      TEXT PRIMARY KEY,
        hostname         TEXT NOT NULL,
        boot_id          TEXT NOT NULL,
        pid              INTEGER NOT NULL,
        pid_started_at   REAL,
        role             TEXT NOT NULL,
        version          TEXT NOT NULL,
        started_at       REAL NOT NULL,
        heartbeat_at     REAL NOT NULL,
        lease_expires_at REAL NOT NULL,
        stopped_at       REAL
    )""",
    # Exactly-once dedup: at most one active, non-forced job per request key, whoever races.
    f"""
    CREATE UNIQUE INDEX IF NOT EXISTS jobs_active_request_key
        ON jobs (request_key) WHERE status IN {ACTIVE_STATUSES_SQL} AND forced = 0""",
    # The reaper's range scan: active rows ordered by their own lease deadline.
    "CREATE INDEX IF NOT EXISTS jobs_status_lease_deadline ON jobs (status, lease_deadline)",
    # The cancel poller and drain: one instance's active rows.
    "CREATE INDEX IF NOT EXISTS jobs_owner_status ON jobs (owner_instance, status)",
    # find_reusable: newest rows of one request key.
    "CREATE INDEX IF NOT EXISTS jobs_request_key_created ON jobs (request_key, created_at)",
    # purge_terminal: terminal rows by age.
    "CREATE INDEX IF NOT EXISTS jobs_status_finished ON jobs (status, finished_at)",
    # list_jobs: newest first.
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at)",
)

# v2: the same columns with `output` moved to the end of the row. SQLite builds a whole row
# in memory to write it, except a zero-filled blob in the LAST column, which it writes as
# zeroed pages: only there can complete() reserve a large output with zeroblob() and fill
# it in place from the spool file (incremental blob I/O), so an output of
# max_output_bytes is never in memory. The table is rebuilt (sqlite.org/lang_altertable.html,
# "other kinds of table schema changes"), its columns named as they were at v2; the steps
# re-run in order rebuild the same table again.
_V2_COLUMN_DEFS = (*(c for c in _JOB_COLUMN_DEFS if c[0] != "output"),
                   ("output", "TEXT"))  # last: UTF-8 as TEXT, or as a BLOB if large
_V2_COLUMNS = ", ".join(column for column, _ in _V2_COLUMN_DEFS)
_SCHEMA_V2 = (
    _create_jobs_table("jobs_v2", _V2_COLUMN_DEFS),
    f"INSERT INTO jobs_v2 ({_V2_COLUMNS}) SELECT {_V2_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v2 RENAME TO jobs",
    *_SCHEMA_V1[2:],  # the indexes went with the old table
)

# v3: `requeued_at` (a job queued again after its owner left it unstarted: at most once).
# Rebuilt like v2, so that `output` stays the last column (ALTER TABLE ADD COLUMN appends).
_V3_COLUMN_DEFS = (*(c for c in _V2_COLUMN_DEFS if c[0] != "output"),
                   ("requeued_at", "REAL"), ("output", "TEXT"))
_SCHEMA_V3 = (
    _create_jobs_table("jobs_v3", _V3_COLUMN_DEFS),
    f"INSERT INTO jobs_v3 ({_V2_COLUMNS}) SELECT {_V2_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v3 RENAME TO jobs",
    *_SCHEMA_V1[2:],
)

# v4: `principal` (who made the job; NULL for the rows before). Rebuilt like v3, so that
# `output` stays last.
_V3_COLUMNS = ", ".join(column for column, _ in _V3_COLUMN_DEFS)
_V4_COLUMN_DEFS = (*(c for c in _V3_COLUMN_DEFS if c[0] != "output"),
                   ("principal", "TEXT"), ("output", "TEXT"))
_SCHEMA_V4 = (
    _create_jobs_table("jobs_v4", _V4_COLUMN_DEFS),
    f"INSERT INTO jobs_v4 ({_V3_COLUMNS}) SELECT {_V3_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v4 RENAME TO jobs",
    *_SCHEMA_V1[2:],
)

# v6: `requeue_count`, `requeue_reasons` (the bounded uncharged re-queues and why) and
# `orphaned_by` (which host orphaned it: an orphaning on the job's own host is final).
# Rebuilt like v4, so that `output` stays last; every column of the v4 table is copied.
_V4_COLUMNS = ", ".join(column for column, _ in _V4_COLUMN_DEFS)
_V6_COLUMN_DEFS = (*(c for c in _V4_COLUMN_DEFS if c[0] != "output"),
                   ("requeue_count", "INTEGER NOT NULL DEFAULT 0"),
                   ("requeue_reasons", "TEXT"), ("orphaned_by", "TEXT"), ("output", "TEXT"))
_SCHEMA_V6 = (
    _create_jobs_table("jobs_v6", _V6_COLUMN_DEFS),
    f"INSERT INTO jobs_v6 ({_V4_COLUMNS}) SELECT {_V4_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v6 RENAME TO jobs",
    *_SCHEMA_V1[2:],
)

# v11: worker hosts (issue 42): `runs_on`, `claimed_at`, `unschedulable_reason`. One host
# never has a remote job (admission refuses runs_on other than "here" on SQLite), but the
# columns exist so every row reads alike. Rebuilt like v6, so that `output` stays last; and
# `gateway_instances.capabilities` (ADD COLUMN: that table has no in-place blob).
_V6_COLUMNS = ", ".join(column for column, _ in _V6_COLUMN_DEFS)
_V11_COLUMN_DEFS = (*(c for c in _V6_COLUMN_DEFS if c[0] != "output"),
                    ("runs_on", "TEXT"), ("claimed_at", "REAL"),
                    ("unschedulable_reason", "TEXT"), ("output", "TEXT"))
_SCHEMA_V11 = (
    _create_jobs_table("jobs_v11", _V11_COLUMN_DEFS),
    f"INSERT INTO jobs_v11 ({_V6_COLUMNS}) SELECT {_V6_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v11 RENAME TO jobs",
    *_SCHEMA_V1[2:],
    "ALTER TABLE gateway_instances ADD COLUMN capabilities TEXT",
)

# v15: `adopted_at` (when a gateway last adopted the job). Rebuilt like v11, not ADD COLUMN:
# that appends after `output`, and complete()'s in-place blob write needs `output` last.
_V11_COLUMNS = ", ".join(column for column, _ in _V11_COLUMN_DEFS)
_V15_COLUMN_DEFS = (*(c for c in _V11_COLUMN_DEFS if c[0] != "output"),
                    ("adopted_at", "REAL"), ("output", "TEXT"))
_SCHEMA_V15 = (
    _create_jobs_table("jobs_v15", _V15_COLUMN_DEFS),
    f"INSERT INTO jobs_v15 ({_V11_COLUMNS}) SELECT {_V11_COLUMNS} FROM jobs",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_v15 RENAME TO jobs",
    *_SCHEMA_V1[2:],
)

# (version, statements) in order, each version in one transaction; re-running a version's
# statements in order changes nothing.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, _SCHEMA_V1), (2, _SCHEMA_V2), (3, _SCHEMA_V3), (4, _SCHEMA_V4),
    (5, SCHEMA_V5),  # usage totals and budgets (usage.py)
    (6, _SCHEMA_V6),
    (7, SCHEMA_V7),  # the lowest writer and the renewal wait (meta.py)
    (8, SWEEPS_SCHEMA),  # one sweeper per interval (sweeps.py)
    (11, _SCHEMA_V11),  # worker hosts
    (12, ATTEMPTS_SCHEMA),  # attempt groups (attempts.py)
    (13, OUTBOX_SCHEMA),  # completion notices (outbox.py)
    (14, ()),  # remote worktree patches: PostgreSQL only (one host has no remote job)
    (15, _SCHEMA_V15))
assert MIGRATIONS[-1][0] == SCHEMA_VERSION, "add a migration when SCHEMA_VERSION changes"

# -- instances ----------------------------------------------------------------------------

# Upsert: a re-registering instance (after a heartbeat outage) keeps its started_at and is
# alive again (stopped_at cleared); its lease restarts from now.
UPSERT_INSTANCE = """
INSERT INTO gateway_instances (instance_id, hostname, boot_id, pid, pid_started_at, role,
                               version, started_at, heartbeat_at, lease_expires_at, stopped_at,
                               capabilities)
VALUES (:instance_id, :hostname, :boot_id, :pid, :pid_started_at, :role, :version,
        COALESCE(:started_at, :now), :now, :now + :ttl_s, NULL, :capabilities)
ON CONFLICT (instance_id) DO UPDATE SET
    capabilities = COALESCE(excluded.capabilities, gateway_instances.capabilities),
    hostname = excluded.hostname, boot_id = excluded.boot_id, pid = excluded.pid,
    pid_started_at = excluded.pid_started_at, role = excluded.role,
    version = excluded.version, heartbeat_at = excluded.heartbeat_at,
    lease_expires_at = excluded.lease_expires_at, stopped_at = NULL"""

# Only the first stop counts: the row records when the instance really went away.
MARK_INSTANCE_STOPPED = """
UPDATE gateway_instances SET stopped_at = :now
WHERE instance_id = :instance_id AND stopped_at IS NULL"""

# Renews exactly one instance row (the caller's own). This row IS the lease of every job the
# instance owns (the reaper reads it), so a heartbeat costs one row whatever the job count.
# The worst renewal wait of the last hour rides along (NULL: the caller measured none yet).
RENEW_INSTANCE_LEASE = """
UPDATE gateway_instances SET heartbeat_at = :now, lease_expires_at = :now + :ttl_s,
    renewal_wait_ms_max_1h = COALESCE(:renewal_wait_ms, renewal_wait_ms_max_1h)
WHERE instance_id = :instance_id"""

# Only rows stopped, or whose lease expired, more than the threshold ago: a live instance's
# row (lease in the future) is never collected.
# A lapsed row is collected only by a gateway of its host that found its pid dead (:keep
# lists the live ones): a collected row is then proof that its owner is gone (issue 23).
GC_INSTANCES = """
DELETE FROM gateway_instances
WHERE (stopped_at IS NOT NULL AND stopped_at < :now - :older_than_s)
   OR (lease_expires_at < :now - :older_than_s
       AND (:hostname IS NULL OR hostname = :hostname)
       AND instance_id NOT IN (SELECT value FROM json_each(:keep)))"""

LIST_INSTANCES = f"""
SELECT {INSTANCE_COLUMN_LIST} FROM gateway_instances ORDER BY started_at, instance_id"""

# -- admission and transitions ------------------------------------------------------------

# Reuse only non-forced rows that are active (any age) or completed within the window
# measured from finished_at; failed/cancelled/timed_out/orphaned never match.
FIND_REUSABLE = f"""
SELECT {_JOB_COLUMNS} FROM jobs
WHERE request_key = :request_key AND forced = 0
  AND (status IN {ACTIVE_STATUSES_SQL}
       OR (status = 'completed' AND finished_at >= :now - :dedup_window_s))
ORDER BY created_at DESC, id DESC
LIMIT 1"""

# The partial unique index jobs_active_request_key is the arbiter: a second active,
# non-forced row with the same key is not inserted (no row returned), whoever races.
INSERT_JOB = f"""
INSERT INTO jobs ({_NEW_JOB_COLUMNS})
VALUES (:id, :provider, CASE WHEN :running THEN 'running' ELSE 'queued' END, :request_key,
        :transport, :correlation_id, :owner_instance, :now + :ttl_s, :hostname, :working_dir,
        :model, :session_id, :request_json, :now, :now, :forced, :boot_id, :principal,
        CASE WHEN :running THEN :now END)
ON CONFLICT (request_key) WHERE status IN {ACTIVE_STATUSES_SQL} AND forced = 0 DO NOTHING
RETURNING {_JOB_COLUMNS}"""

# The one active, non-forced row the index let win (read in the same transaction).
FIND_ACTIVE_BY_KEY = f"""
SELECT id FROM jobs
WHERE request_key = :request_key AND forced = 0 AND status IN {ACTIVE_STATUSES_SQL}"""

# queued -> running only for the owner: a row orphaned or cancelled while it waited in the
# queue never starts (the manager spawns only after this returns true).
MARK_RUNNING = """
UPDATE jobs SET status = 'running', started_at = :now, updated_at = :now,
                lease_deadline = :now + :ttl_s
WHERE id = :job_id AND owner_instance = :owner_instance AND status = 'queued'"""

# A process identity is stamped only on a running row this instance still owns.
RECORD_PROCESS = """
UPDATE jobs SET pid = :pid, pgid = :pgid, pid_started_at = :pid_started_at, updated_at = :now
WHERE id = :job_id AND owner_instance = :owner_instance AND status = 'running'"""

# Guarded terminal write, by the row's owner only: an active row, or a row orphaned from
# another host (the self-heal of a stale owner that revived: nobody on its host could prove
# it gone); every other terminal row is final, an orphaning on the job's own host too (a
# poller that read `orphaned` stopped polling: the state it saw must stay true). The owner
# test matters once jobs change hands: a job adopted or re-queued while its first owner was
# stopped may be a different run by now (re-queued: a new launch in a new spool), and a
# stale owner waking up must not end it with what it saw of the old one. Every taker CASes
# owner_instance to itself before it writes. A cancel request on the row turns any outcome
# into `cancelled` (cancelled wins over a late completion). A large
# output (:reserve bytes) is reserved as a zero blob here and written in place right after,
# in the same transaction (complete()).
COMPLETE_JOB = f"""
UPDATE jobs SET
    status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE :status END,
    error_kind = CASE WHEN cancel_requested_at IS NOT NULL AND :status <> 'cancelled'
                      THEN 'cancelled' ELSE :error_kind END,
    error = CASE WHEN cancel_requested_at IS NOT NULL AND :status <> 'cancelled'
                 THEN COALESCE(:error, :cancelled_error) ELSE :error END,
    exit_code = :exit_code, stderr_tail = :stderr_tail,
    output = CASE WHEN :reserve IS NULL THEN :output ELSE zeroblob(:reserve) END,
    output_bytes = :output_bytes, truncated = :truncated, result_json = :result_json,
    finished_at = MIN(COALESCE(:ended_at, :now), :now), updated_at = :now,
    lease_deadline = NULL
WHERE id = :job_id AND owner_instance = :owner_instance
  AND (status IN {ACTIVE_STATUSES_SQL}
       OR (status = 'orphaned' AND orphaned_by IS NOT hostname))"""

# A cancel lands only on an active row, and the first request's time is kept.
REQUEST_CANCEL = f"""
UPDATE jobs SET cancel_requested_at = :now, updated_at = :now
WHERE id = :job_id AND status IN {ACTIVE_STATUSES_SQL} AND cancel_requested_at IS NULL"""

# Only this instance's still-active rows: a cancel on a finished job needs no kill.
LIST_CANCEL_REQUESTED = f"""
SELECT id FROM jobs
WHERE owner_instance = :owner_instance AND status IN {ACTIVE_STATUSES_SQL}
  AND cancel_requested_at IS NOT NULL
ORDER BY created_at"""

# Partial output only while running and owned: a late flush never touches a terminal row
# or a row that another instance now answers for.
SAVE_PROGRESS = """
UPDATE jobs SET output_bytes = :output_bytes, output = :output, stderr_tail = :stderr_tail,
                updated_at = :now
WHERE id = :job_id AND owner_instance = :owner_instance AND status = 'running'"""

# -- the reaper ---------------------------------------------------------------------------

# A job's lease is the LATER of its own lease_deadline (set when it was admitted and when it
# started) and its owner's instance lease (renewed by every heartbeat). A job is a candidate
# only when both passed (plus the grace for http jobs); an owner whose row is gone
# (collected) holds no lease. Never because another instance started. `lease_deadline <
# :now` first, so the range scan on jobs_status_lease_deadline does the work; the owner is
# one primary-key probe per row.
_LEASE_EXPIRED = f"""
status IN {ACTIVE_STATUSES_SQL} AND lease_deadline < :now
  AND (transport <> 'http' OR lease_deadline + :http_grace_s < :now)
  AND NOT EXISTS (
      SELECT 1 FROM gateway_instances AS owner
      WHERE owner.instance_id = jobs.owner_instance
        AND owner.lease_expires_at
            + CASE WHEN jobs.transport = 'http' THEN :http_grace_s ELSE 0 END >= :now)"""

# Narrow and bounded (base.REAPER_COLUMNS, :limit rows, oldest lease first): a sweep never
# reads requests or outputs, and its cost does not grow with a backlog.
LIST_EXPIRED_CANDIDATES = f"""
SELECT {_REAPER_COLUMNS} FROM jobs WHERE {_LEASE_EXPIRED}
ORDER BY lease_deadline
LIMIT :limit"""

# The same predicate, re-checked inside the UPDATE under the write lock (BEGIN IMMEDIATE: a
# heartbeat is serialized before or after the whole statement, never in between), and only
# on the candidates the reaper listed and judged (:job_ids, a JSON array, without the ones
# its probe proved alive): a job that lapsed after the listing was never probed, so it waits
# for the next sweep.
RECOVER_EXPIRED_LEASES = f"""
UPDATE jobs SET status = 'orphaned', error = COALESCE(error, :orphaned_error),
                error_kind = 'orphaned', finished_at = :now, updated_at = :now,
                lease_deadline = NULL, orphaned_by = :orphaned_by
WHERE id IN (SELECT value FROM json_each(:job_ids))
  AND {_LEASE_EXPIRED}
RETURNING {_REAPER_COLUMNS}"""

# -- retention and reads ------------------------------------------------------------------

# Only terminal rows past retention; an active row is never deleted, whatever its age.
# One batch of retention: any :limit rows past it, read off jobs_status_finished's ranges
# (no ORDER BY, which would sort the whole backlog per batch).
PURGE_TERMINAL = """
DELETE FROM jobs WHERE id IN (
  SELECT id FROM jobs
  WHERE status IN ('completed','failed','cancelled','timed_out','orphaned')
    AND finished_at < :now - :older_than_s
  LIMIT :limit)
RETURNING id"""

GET_JOB = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = :job_id"

# Ids starting with :prefix. LIKE (its wildcards escaped by like_prefix) narrows; the substr
# test makes it exact, since SQLite's LIKE ignores ASCII case. Bounded by :limit.
FIND_JOB_IDS = r"""
SELECT id FROM jobs
WHERE id LIKE :pattern ESCAPE '\' AND substr(id, 1, length(:prefix)) = :prefix
ORDER BY id LIMIT :limit"""

# The light read (status, wait, list, cancel): the output stays in the table and the parsed
# result loses its `text` (each can be max_output_bytes; those reads need neither). No
# json_valid() guard: it would parse (and copy) a large value once more; result_json is
# only written by complete(), as canonical JSON, and a malformed one falls back to Python.
_LIGHT_JOB_COLUMNS = ", ".join(
    "NULL AS output" if name == "output"
    else "json_remove(result_json, '$.text') AS result_json" if name == "result_json"
    else name
    for name in JobRow.column_names())

GET_JOB_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs WHERE id = :job_id"
# Admission's dedup lookup reads light rows too: a duplicate of a finished job with a large
# output must not load that output to answer with the job's id and status.
FIND_REUSABLE_LIGHT = FIND_REUSABLE.replace(f"SELECT {_JOB_COLUMNS}",
                                            f"SELECT {_LIGHT_JOB_COLUMNS}", 1)

# Optional filters as NULL-able parameters (statuses: a JSON array) keep one statement text.
# The principal filter is in the query, before LIMIT, so a caller's page is full whenever it
# has that many jobs (#23): `unowned_too` adds the rows from before schema 4 (no principal).
_LIST_JOBS_FILTERS = """
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:provider IS NULL OR provider = :provider)
  AND (:owner_instance IS NULL OR owner_instance = :owner_instance)
  AND (:principal IS NULL OR principal = :principal
       OR (:unowned_too AND principal IS NULL))
ORDER BY created_at DESC, id DESC
LIMIT :limit"""
LIST_JOBS = f"SELECT {_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"
LIST_JOBS_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs{_LIST_JOBS_FILTERS}"

# The dashboard's page (base.JobsPage): the keyset is the previous page's last row, read
# by its id (a time passed back and forth as a float could miss its own row by a rounding);
# a cursor whose row is gone yields an empty page, never the table from its start.
_JOBS_PAGE_FILTERS = """
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:provider IS NULL OR provider = :provider)
  AND (:hostname IS NULL OR hostname = :hostname)
  AND (:after_id IS NULL
       OR (created_at, id) < (SELECT created_at, id FROM jobs WHERE id = :after_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit"""
LIST_JOBS_PAGE = f"SELECT {_JOB_COLUMNS} FROM jobs{_JOBS_PAGE_FILTERS}"
LIST_JOBS_PAGE_LIGHT = f"SELECT {_LIGHT_JOB_COLUMNS} FROM jobs{_JOBS_PAGE_FILTERS}"

# The row's rowid: incremental blob I/O addresses a value by table, column and rowid.
JOB_ROWID = "SELECT rowid FROM jobs WHERE id = :job_id"

# What read_output pages: the output is read in place (incremental blob I/O reads only the
# pages of the range asked for; a TEXT value reads as its UTF-8 bytes), so only its type is
# selected here; result_json only when the answer is asked for (CASE is evaluated lazily).
READ_OUTPUT_SOURCE = """
SELECT rowid, typeof(output) AS output_type,
       CASE WHEN :answer THEN result_json END AS result_json
FROM jobs WHERE id = :job_id"""



# -- detach, adoption, re-queue (docs/architecture.md) --------------------------------------

# Detach: each named RUNNING job of this instance gets lease_deadline = now + its seconds
# (:seconds, a JSON object id -> seconds), never an earlier deadline than it had: until then
# its supervisor may still be running it, and no gateway may orphan it.
EXTEND_LEASES = """
UPDATE jobs SET lease_deadline = MAX(COALESCE(lease_deadline, 0),
                                     :now + (SELECT value FROM json_each(:seconds)
                                             WHERE key = jobs.id)),
                updated_at = :now
WHERE owner_instance = :instance_id AND status = 'running'
  AND id IN (SELECT key FROM json_each(:seconds))"""

# What an adopter may take over (the caller probes an owner on this host for a live pid):
# jobs of this host owned by another instance whose row is stopped, collected, or on this
# host and boot. Active ones only: `orphaned` is final (no adopter heals or re-queues it).
# (:orphaned_within_s is unused, kept for the protocol's signature.) A running http job
# waits until its own lease passed: a
# detaching owner drains it until then. Light columns, prefixed: the owner shares names.
# Jobs whose owner is collected, stopped or lapsed come first, then the oldest: a busy
# host's live jobs (another window's burst) never fill the batch ahead of a dead owner's,
# which the reaper would otherwise orphan unseen (base.JobStore.list_adoption_candidates).
_CANDIDATE_COLUMNS = ", ".join(
    f"NULL AS {name}" if name in ("output", "result_json") else f"jobs.{name} AS {name}"
    for name in JobRow.column_names())
LIST_ADOPTION_CANDIDATES = f"""
SELECT {_CANDIDATE_COLUMNS},
       {OWNER_COLUMN_LIST}
FROM jobs LEFT JOIN gateway_instances AS owner ON owner.instance_id = jobs.owner_instance
WHERE jobs.hostname = :hostname AND jobs.owner_instance IS NOT :instance_id
  AND jobs.status IN {ACTIVE_STATUSES_SQL}
  AND NOT (jobs.transport = 'http' AND jobs.status = 'running'
           AND jobs.lease_deadline >= :now)
  AND (owner.instance_id IS NULL OR owner.stopped_at IS NOT NULL
       OR (owner.hostname = :hostname AND owner.boot_id = :boot_id))
ORDER BY CASE WHEN owner.instance_id IS NULL OR owner.stopped_at IS NOT NULL
                   OR owner.lease_expires_at < :now THEN 0 ELSE 1 END,
         jobs.created_at, jobs.id
LIMIT :limit"""

# Adoption: one compare-and-set on owner_instance, from the owner the adopter read, so of
# any number of gateways adopting at once exactly one wins. Only a job of this host; a
# running one only of this boot (its supervisor's pid means something only here). The
# status stays: an orphaned row is healed by the adopter's guarded complete(). The winner
# stamps adopted_at (the job page's timeline); a losing CAS writes nothing.
ADOPT_JOB = f"""
UPDATE jobs SET owner_instance = :instance_id, updated_at = :now, adopted_at = :now,
                lease_deadline = CASE WHEN status IN {ACTIVE_STATUSES_SQL}
                                      THEN MAX(COALESCE(lease_deadline, 0), :now + :ttl_s) END
WHERE id = :job_id AND owner_instance IS :expected_owner AND status = :expected_status
  AND status IN ('queued','running','orphaned') AND hostname = :hostname
  AND (status <> 'running' OR boot_id = :boot_id)
RETURNING {_LIGHT_JOB_COLUMNS}"""

# Re-queue of work that never ran: the same CAS on owner_instance (one winner), never a job
# with a cancel request, and never beside an active non-forced twin (the dedup index stays
# exactly-once). That it never started is the caller's proof (the row was queued, or its
# spool's start record was claimed for the re-queue, so no supervisor can ever run it): a
# run is launched at most once however often its job is queued again, and each re-queue
# needs an owner proven gone, so their number is bounded by real gateway deaths. Only a
# HTTP call that started (it may have reached the API, and been billed) is retried at most
# once: requeued_at IS NULL, then stamped.
REQUEUE_JOB = f"""
UPDATE jobs SET status = 'queued', owner_instance = :instance_id, boot_id = :boot_id,
                claimed_at = NULL, requeued_at = :now, lease_deadline = :now + :ttl_s, updated_at = :now,
                requeue_count = requeue_count + 1,
                requeue_reasons = COALESCE(:requeue_reasons, requeue_reasons),
                started_at = NULL, finished_at = NULL, pid = NULL, pgid = NULL,
                pid_started_at = NULL, exit_code = NULL, error = NULL, error_kind = NULL,
                output = NULL, output_bytes = 0, stderr_tail = NULL, truncated = 0
WHERE id = :job_id AND owner_instance IS :expected_owner AND status = :expected_status
  AND status IN ('queued','running','orphaned') AND hostname = :hostname
  AND cancel_requested_at IS NULL
  AND (requeued_at IS NULL OR transport <> 'http' OR started_at IS NULL)
  AND (forced = 1 OR NOT EXISTS (
      SELECT 1 FROM jobs AS twin
      WHERE twin.request_key = jobs.request_key AND twin.id <> jobs.id AND twin.forced = 0
        AND twin.status IN {ACTIVE_STATUSES_SQL}))
RETURNING {_LIGHT_JOB_COLUMNS}"""

# -- worker hosts -------------------------------------------------------------------------

PUBLISH_CAPABILITIES = """
UPDATE gateway_instances SET capabilities = :capabilities WHERE instance_id = :instance_id"""
