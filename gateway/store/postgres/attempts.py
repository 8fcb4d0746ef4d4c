"""PostgreSQL SQL of attempt groups (issue 39; gateway/store/attempts.py says the model).

The same tables and invariants as sqlite/attempts.py (which states each), in this dialect.
Times are epoch seconds (double precision) on the database clock, like SQLite's REAL ones:
a group's durations are differences, never compared with a wall clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    GroupEnd,
    NewAttemptGroup,
    end_params,
    group_params,
)
from gateway.store.outbox import (
    GROUP_PREFIX,
    GROUP_PROVIDER,
    NOTICE_ERROR_CHARS,
    NOTIFIED_GROUP_STATUSES,
)

# A migration (sql.py names its version), additive: two new tables.
ATTEMPTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS attempt_groups (
    group_id text PRIMARY KEY, dedup_key text NOT NULL, principal text,
    prompt text NOT NULL, targets_json text NOT NULL, base_sha text NOT NULL,
    working_dir text NOT NULL, check_json text, check_timeout_s double precision NOT NULL,
    until_rule text NOT NULL, judge_json text, status text NOT NULL,
    winner_job_id text, winner_reason text, judge_job_id text, judge_result_json text,
    created_at double precision NOT NULL, updated_at double precision NOT NULL,
    ended_at double precision)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS attempt_groups_running_key
    ON attempt_groups (dedup_key) WHERE status = 'running'""",
    "CREATE INDEX IF NOT EXISTS attempt_groups_created ON attempt_groups (created_at)",
    """CREATE TABLE IF NOT EXISTS attempts (
    job_id text PRIMARY KEY, group_id text NOT NULL, ordinal integer NOT NULL,
    check_state text NOT NULL, check_claimed_by text, check_exit_code integer,
    check_output_tail text, check_duration_s double precision, check_reason text,
    check_started_at double precision, check_ended_at double precision,
    UNIQUE (group_id, ordinal))""",
)

RUNNING_KEY_INDEX = "attempt_groups_running_key"
_NOW = "extract(epoch from clock_timestamp())"

_GROUP_COLUMNS = (
    "group_id, dedup_key, principal, prompt, targets_json, base_sha, working_dir, check_json, "
    "check_timeout_s, until_rule, judge_json, status, winner_job_id, winner_reason, "
    "judge_job_id, judge_result_json, created_at, updated_at, ended_at")
_ATTEMPT_COLUMNS = (
    "job_id, group_id, ordinal, check_state, check_claimed_by, check_exit_code, "
    "check_output_tail, check_duration_s, check_reason, check_started_at, check_ended_at")

# A plain INSERT: the partial unique index attempt_groups_running_key is the arbiter (the
# second of two racing transactions waits for the first, then fails: DuplicateActiveGroup).
INSERT_GROUP = f"""
INSERT INTO attempt_groups (group_id, dedup_key, principal, prompt, targets_json, base_sha,
    working_dir, check_json, check_timeout_s, until_rule, judge_json, status, created_at,
    updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'running', {_NOW}, {_NOW})
RETURNING {_GROUP_COLUMNS}"""

INSERT_ATTEMPT = """
INSERT INTO attempts (job_id, group_id, ordinal, check_state) VALUES ($1, $2, $3, 'pending')"""

FIND_RUNNING_GROUP_ID = ("SELECT group_id FROM attempt_groups "
                         "WHERE dedup_key = $1 AND status = 'running'")

# As sqlite/attempts.py FIND_GROUP: the running group, or one done within the window.
FIND_GROUP = f"""
SELECT {_GROUP_COLUMNS} FROM attempt_groups
WHERE dedup_key = $1
  AND (status = 'running' OR (status = 'done' AND ended_at >= {_NOW} - $2))
ORDER BY created_at DESC, group_id DESC LIMIT 1"""

GET_GROUP = f"SELECT {_GROUP_COLUMNS} FROM attempt_groups WHERE group_id = $1"

LIST_GROUPS = f"""
SELECT {_GROUP_COLUMNS} FROM attempt_groups
WHERE ($1::text IS NULL OR principal = $1) AND ($3::text IS NULL OR status = $3)
ORDER BY created_at DESC, group_id DESC LIMIT $2"""

LIST_ATTEMPTS = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE group_id = $1 ORDER BY ordinal"
GET_ATTEMPT = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = $1"

# Invariant: a check runs at most once: only a pending check is claimed, by one caller.
CLAIM_CHECK = f"""
UPDATE attempts SET check_state = 'running', check_claimed_by = $2, check_started_at = {_NOW}
WHERE job_id = $1 AND check_state = 'pending'"""

# Invariant: a check that never ran is skipped once, and never after it was claimed.
SKIP_CHECK = f"""
UPDATE attempts SET check_state = 'skipped', check_reason = $2, check_ended_at = {_NOW}
WHERE job_id = $1 AND check_state = 'pending'"""

# Invariant: a check has one result; only a running check gets it, the first write wins.
RECORD_CHECK = f"""
UPDATE attempts SET check_state = 'done', check_exit_code = $2, check_output_tail = $3,
    check_duration_s = $4, check_reason = $5, check_ended_at = {_NOW}
WHERE job_id = $1 AND check_state = 'running'"""

# Invariant: a group moves only from a status its caller read; picked/discarded are final;
# judge_job_id is set once (one judge per group, whoever races to start it).
_NOTIFIED = ", ".join(f"'{status}'" for status in NOTIFIED_GROUP_STATUSES)
# One statement, so one transaction: the group's move and, when it moved to a notified status
# (store/outbox.py: `done`), its notice. The command tag is the final SELECT's: `SELECT 1`
# when the row moved, `SELECT 0` when it was not in an expected status.
# Invariant: the group moves only from one of the expected statuses (re-checked on the locked
# row); its notice is added only from the moved row (`ended`), once (the id
# `group:<group id>:<status>`: a second add is a no-op).
END_GROUP = f"""
WITH ended AS (
UPDATE attempt_groups SET status = $2, updated_at = {_NOW},
    winner_job_id = COALESCE($3, winner_job_id),
    winner_reason = COALESCE($4, winner_reason),
    judge_job_id = COALESCE($5, judge_job_id),
    judge_result_json = COALESCE($6, judge_result_json),
    ended_at = CASE WHEN $7 THEN COALESCE(ended_at, {_NOW}) ELSE ended_at END
WHERE group_id = $1 AND status = ANY($8::text[])
  AND ($5::text IS NULL OR judge_job_id IS NULL OR judge_job_id = $5::text)
RETURNING group_id, status, winner_job_id, winner_reason, created_at, updated_at, ended_at),
noticed AS (
INSERT INTO completion_notices (id, job_id, provider, status, error, duration_s, created_at,
                                next_attempt_at)
SELECT '{GROUP_PREFIX}' || group_id || ':' || status, COALESCE(winner_job_id, group_id),
       '{GROUP_PROVIDER}', status, substr(winner_reason, 1, {NOTICE_ERROR_CHARS}),
       GREATEST(COALESCE(ended_at, updated_at) - created_at, 0), now(), now()
FROM ended WHERE status IN ({_NOTIFIED})
ON CONFLICT (id) DO NOTHING)
SELECT 1 FROM ended"""


async def insert_group(conn: asyncpg.Connection, group: NewAttemptGroup,
                       job_ids: Sequence[str]) -> AttemptGroupRow:
    """Inside the caller's transaction: the group row and its attempt rows."""
    params = group_params(group)
    row = await conn.fetchrow(
        INSERT_GROUP, params["group_id"], params["dedup_key"], params["principal"],
        params["prompt"], params["targets_json"], params["base_sha"], params["working_dir"],
        params["check_json"], params["check_timeout_s"], params["until_rule"],
        params["judge_json"])
    for ordinal, job_id in enumerate(job_ids):
        await conn.execute(INSERT_ATTEMPT, job_id, group.group_id, ordinal)
    assert row is not None  # INSERT ... RETURNING always returns the row it inserted
    return AttemptGroupRow.from_mapping(row)


async def running_group_id(conn: asyncpg.Connection, dedup_key: str) -> str | None:
    value = await conn.fetchval(FIND_RUNNING_GROUP_ID, dedup_key)
    return None if value is None else str(value)


def duplicate(exc: asyncpg.UniqueViolationError) -> bool:
    """Whether a unique violation is the running-group arbiter's (not an id clash)."""
    return bool(exc.constraint_name == RUNNING_KEY_INDEX)


def attempt_row(row: asyncpg.Record) -> AttemptRow:
    return AttemptRow.from_mapping(row)


def group_row(row: asyncpg.Record) -> AttemptGroupRow:
    return AttemptGroupRow.from_mapping(row)


def record_args(job_id: str, result: CheckResult) -> tuple[object, ...]:
    return (job_id, result.exit_code, result.output_tail, float(result.duration_s),
            result.reason)


def end_args(end: GroupEnd) -> tuple[object, ...]:
    params = end_params(end)
    return (end.group_id, params["status"], params["winner_job_id"], params["winner_reason"],
            params["judge_job_id"], params["judge_result_json"], params["final"],
            [status.value for status in end.expected])

