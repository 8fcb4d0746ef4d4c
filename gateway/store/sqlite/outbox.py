"""SQLite SQL of the completion-notice outbox (issue 40; store/outbox.py says what it is).

Every statement runs inside the caller's `BEGIN IMMEDIATE` transaction (store.py
`_transaction`): the notice is added by the same transaction as the terminal write, and a
claim is serialized with every other write on the file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection
from datetime import UTC, datetime

from gateway.store.base import ACTIVE_STATUSES_SQL
from gateway.store.outbox import NOTICE_ERROR_CHARS, Notice, Settlement

_COLUMNS = ", ".join(Notice.column_names())
_TIME_FIELDS = ("created_at", "next_attempt_at", "claim_expires_at", "delivered_at",
                "failed_at")

# A migration (sql.py names its version), additive: one new table and the index of the
# deliverers' scan (only undelivered, unfailed notices: the table's tail).
OUTBOX_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS completion_notices (
    id TEXT PRIMARY KEY, job_id TEXT NOT NULL, provider TEXT NOT NULL, status TEXT NOT NULL,
    error_kind TEXT, error TEXT, duration_s REAL, cost_usd REAL, created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL, claimed_by TEXT,
    claim_expires_at REAL, sinks_done TEXT NOT NULL DEFAULT '[]', delivered_at REAL,
    outcome TEXT, failed_at REAL, last_error TEXT)""",
    """CREATE INDEX IF NOT EXISTS completion_notices_due ON completion_notices (next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL""",
    "CREATE INDEX IF NOT EXISTS completion_notices_job ON completion_notices (job_id)",
)

# Invariant: one notice per terminal state of a job, added with the write that made it
# terminal (same transaction). The id is `<job id>:<status>`, so a statement run twice (or a
# heal of an orphaned row to its real outcome, which is a new status) adds nothing twice.
ADD_NOTICES = f"""
INSERT INTO completion_notices (id, job_id, provider, status, error_kind, error, duration_s,
                                cost_usd, created_at, next_attempt_at)
SELECT id || ':' || status, id, provider, status, error_kind,
       substr(error, 1, {NOTICE_ERROR_CHARS}),
       MAX(finished_at - COALESCE(started_at, created_at), 0), :cost_usd, :now, :now
FROM jobs WHERE id IN (SELECT value FROM json_each(:job_ids))
  AND status NOT IN {ACTIVE_STATUSES_SQL}
ON CONFLICT (id) DO NOTHING"""

# Invariant: a notice is claimed by one deliverer at a time: only one that is neither
# delivered nor failed, is due, and whose previous claim (if any) has lapsed. The attempt is
# counted with the claim, so a deliverer that dies mid-delivery still uses one up.
CLAIM_NOTICES = f"""
UPDATE completion_notices SET claimed_by = :instance_id, claim_expires_at = :now + :lease_s,
                              attempts = attempts + 1
WHERE id IN (SELECT id FROM completion_notices
             WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= :now
               AND (claim_expires_at IS NULL OR claim_expires_at < :now)
             ORDER BY next_attempt_at LIMIT :limit)
RETURNING {_COLUMNS}"""

# Invariant: only the holder of the claim records a sink done, and only while the notice is
# still undelivered (a sink listed here is never sent again by a later attempt).
RECORD_SINK = """
UPDATE completion_notices SET sinks_done = :sinks_done
WHERE id = :id AND claimed_by = :instance_id AND delivered_at IS NULL AND failed_at IS NULL"""

READ_SINKS = "SELECT sinks_done FROM completion_notices WHERE id = :id"

# Invariant: only the holder of the claim settles it, once (delivered_at or failed_at set
# ends it; `retry` releases the claim for a later attempt).
_CLAIM_HELD = ("id = :id AND claimed_by = :instance_id AND delivered_at IS NULL "
               "AND failed_at IS NULL")
SETTLE = {
    "delivered": f"""UPDATE completion_notices SET delivered_at = :now, outcome = :outcome,
        claim_expires_at = NULL, last_error = :error WHERE {_CLAIM_HELD}""",
    "skipped": f"""UPDATE completion_notices SET delivered_at = :now, outcome = :outcome,
        claim_expires_at = NULL, last_error = :error WHERE {_CLAIM_HELD}""",
    "failed": f"""UPDATE completion_notices SET failed_at = :now, outcome = :outcome,
        claim_expires_at = NULL, last_error = :error WHERE {_CLAIM_HELD}""",
    "retry": f"""UPDATE completion_notices SET claimed_by = NULL, claim_expires_at = NULL,
        next_attempt_at = :now + :retry_in_s, last_error = :error WHERE {_CLAIM_HELD}""",
}

LIST_NOTICES = f"""SELECT {_COLUMNS} FROM completion_notices
WHERE (:failed_only = 0 OR failed_at IS NOT NULL)
ORDER BY created_at DESC, id LIMIT :limit"""

COUNT_FAILED = "SELECT COUNT(*) FROM completion_notices WHERE failed_at IS NOT NULL"

# Retention: a purged job's notices go with it.
PURGE_NOTICES = "DELETE FROM completion_notices WHERE job_id IN (SELECT value FROM json_each(?))"


def _notice(row: sqlite3.Row) -> Notice:
    data = {name: row[name] for name in row.keys()}  # noqa: SIM118 - a Row iterates values
    for name in _TIME_FIELDS:
        if data.get(name) is not None:
            data[name] = datetime.fromtimestamp(data[name], UTC)
    return Notice.from_mapping(data)


def add_notices(db: sqlite3.Connection, job_ids: Collection[str], now: float,
                cost_usd: float | None = None) -> None:
    if job_ids:
        db.execute(ADD_NOTICES, {"job_ids": json.dumps(list(job_ids)), "now": now,
                                 "cost_usd": cost_usd})


def claim(db: sqlite3.Connection, instance_id: str, lease_s: float, limit: int,
          now: float) -> list[Notice]:
    return [_notice(r) for r in db.execute(CLAIM_NOTICES, {
        "instance_id": instance_id, "lease_s": lease_s, "limit": max(limit, 0), "now": now})]


def record_sink(db: sqlite3.Connection, notice_id: str, instance_id: str, sink: str) -> bool:
    row = db.execute(READ_SINKS, {"id": notice_id}).fetchone()
    if row is None:
        return False
    done = json.loads(row[0])
    if sink not in done:
        done.append(sink)
    return db.execute(RECORD_SINK, {"id": notice_id, "instance_id": instance_id,
                                    "sinks_done": json.dumps(done)}).rowcount == 1


def settle(db: sqlite3.Connection, notice_id: str, instance_id: str, outcome: Settlement,
           retry_in_s: float, error: str | None, now: float) -> bool:
    return db.execute(SETTLE[outcome], {
        "id": notice_id, "instance_id": instance_id, "outcome": outcome, "now": now,
        "retry_in_s": retry_in_s, "error": error}).rowcount == 1


def list_notices(db: sqlite3.Connection, failed_only: bool, limit: int) -> list[Notice]:
    return [_notice(r) for r in db.execute(
        LIST_NOTICES, {"failed_only": int(failed_only), "limit": max(limit, 0)})]


def count_failed(db: sqlite3.Connection) -> int:
    return int(db.execute(COUNT_FAILED).fetchone()[0])
