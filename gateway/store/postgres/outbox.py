"""PostgreSQL SQL of the completion-notice outbox (issue 40; store/outbox.py says what it is).

The notice is added inside the transaction of the terminal write (store.py `complete`,
`recover_expired_leases`); a claim is one UPDATE over rows picked `FOR UPDATE SKIP LOCKED`,
so deliverers on any number of hosts never wait on each other and never claim one notice
twice. Times are the database clock's.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import asyncpg

from gateway.store.base import ACTIVE_STATUSES_SQL
from gateway.store.outbox import NOTICE_ERROR_CHARS, Notice, Settlement

_COLUMNS = ", ".join(Notice.column_names())

# A migration (sql.py names its version), additive: one new table and the index of the
# deliverers' scan (only undelivered, unfailed notices).
OUTBOX_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS completion_notices (
    id text PRIMARY KEY, job_id text NOT NULL, provider text NOT NULL, status text NOT NULL,
    error_kind text, error text, duration_s double precision, cost_usd double precision,
    created_at timestamptz NOT NULL, attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL, claimed_by text, claim_expires_at timestamptz,
    sinks_done text NOT NULL DEFAULT '[]', delivered_at timestamptz, outcome text,
    failed_at timestamptz, last_error text)""",
    """CREATE INDEX IF NOT EXISTS completion_notices_due ON completion_notices (next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL""",
    "CREATE INDEX IF NOT EXISTS completion_notices_job ON completion_notices (job_id)",
)

# Invariant: one notice per terminal state of a job, added with the write that made it
# terminal (same transaction); the id `<job id>:<status>` makes a second add a no-op.
ADD_NOTICES = f"""
INSERT INTO completion_notices (id, job_id, provider, status, error_kind, error, duration_s,
                                cost_usd, created_at, next_attempt_at)
SELECT id || ':' || status, id, provider, status, error_kind,
       substr(error, 1, {NOTICE_ERROR_CHARS}),
       GREATEST(EXTRACT(EPOCH FROM finished_at - COALESCE(started_at, created_at)), 0),
       $2, now(), now()
FROM jobs WHERE id = ANY($1::text[]) AND status NOT IN {ACTIVE_STATUSES_SQL}
ON CONFLICT (id) DO NOTHING"""

# Invariant: a notice is claimed by one deliverer at a time: undelivered, unfailed, due,
# and unclaimed or its claim lapsed, re-checked on the locked row; the attempt is counted
# with the claim (a deliverer that dies mid-delivery uses one up).
CLAIM_NOTICES = f"""
UPDATE completion_notices SET claimed_by = $1,
       claim_expires_at = now() + make_interval(secs => $2), attempts = attempts + 1
WHERE id IN (SELECT id FROM completion_notices
             WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
               AND (claim_expires_at IS NULL OR claim_expires_at < now())
             ORDER BY next_attempt_at LIMIT $3
             FOR UPDATE SKIP LOCKED)
  AND delivered_at IS NULL AND failed_at IS NULL
  AND (claim_expires_at IS NULL OR claim_expires_at < now())
RETURNING {_COLUMNS}"""

# Invariant: only the holder of the open claim records a sink done (a later attempt skips it).
RECORD_SINK = """
UPDATE completion_notices
SET sinks_done = CASE WHEN (sinks_done::jsonb) ? $3 THEN sinks_done
                      ELSE ((sinks_done::jsonb) || to_jsonb($3::text))::text END
WHERE id = $1 AND claimed_by = $2 AND delivered_at IS NULL AND failed_at IS NULL"""

# Invariant: only the holder of the open claim settles it, once.
_CLAIM_HELD = "id = $1 AND claimed_by = $2 AND delivered_at IS NULL AND failed_at IS NULL"
SETTLE = {
    "delivered": f"""UPDATE completion_notices SET delivered_at = now(), outcome = $3,
        claim_expires_at = NULL, last_error = $4 WHERE {_CLAIM_HELD}""",
    "skipped": f"""UPDATE completion_notices SET delivered_at = now(), outcome = $3,
        claim_expires_at = NULL, last_error = $4 WHERE {_CLAIM_HELD}""",
    "failed": f"""UPDATE completion_notices SET failed_at = now(), outcome = $3,
        claim_expires_at = NULL, last_error = $4 WHERE {_CLAIM_HELD}""",
    "retry": f"""UPDATE completion_notices SET claimed_by = NULL, claim_expires_at = NULL,
        next_attempt_at = now() + make_interval(secs => $5), last_error = $4
        WHERE {_CLAIM_HELD} AND $3::text = 'retry'""",
}

LIST_NOTICES = f"""SELECT {_COLUMNS} FROM completion_notices
WHERE (NOT $1 OR failed_at IS NOT NULL)
ORDER BY created_at DESC, id LIMIT $2"""

COUNT_FAILED = "SELECT COUNT(*) FROM completion_notices WHERE failed_at IS NOT NULL"

# Retention: a purged job's notices go with it.
PURGE_NOTICES = "DELETE FROM completion_notices WHERE job_id = ANY($1::text[])"


def _notice(row: Any) -> Notice:
    return Notice.from_mapping(dict(row))


def _applied(status: str) -> bool:
    return status.split()[-1] == "1"


async def add_notices(conn: asyncpg.Connection, job_ids: Collection[str],
                      cost_usd: float | None = None) -> None:
    """Inside the caller's (terminal write's) transaction."""
    if job_ids:
        await conn.execute(ADD_NOTICES, list(job_ids), cost_usd)


async def claim(conn: asyncpg.Connection, instance_id: str, lease_s: float,
                limit: int) -> list[Notice]:
    return [_notice(r) for r in await conn.fetch(CLAIM_NOTICES, instance_id, float(lease_s),
                                                 max(limit, 0))]


async def record_sink(conn: asyncpg.Connection, notice_id: str, instance_id: str,
                      sink: str) -> bool:
    return _applied(await conn.execute(RECORD_SINK, notice_id, instance_id, sink))


async def settle(conn: asyncpg.Connection, notice_id: str, instance_id: str,
                 outcome: Settlement, retry_in_s: float, error: str | None) -> bool:
    args: list[Any] = [notice_id, instance_id, outcome, error]
    if outcome == "retry":
        args.append(float(retry_in_s))
    return _applied(await conn.execute(SETTLE[outcome], *args))


async def list_notices(conn: asyncpg.Connection, failed_only: bool, limit: int) -> list[Notice]:
    return [_notice(r) for r in await conn.fetch(LIST_NOTICES, failed_only, max(limit, 0))]


async def count_failed(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval(COUNT_FAILED) or 0)


def sinks_of(value: str) -> list[str]:
    return list(json.loads(value))
