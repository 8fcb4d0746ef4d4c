"""SQLite SQL of attempt groups (issue 39; gateway/store/attempts.py says the model).

Every write function runs on the connection's thread inside the caller's `BEGIN IMMEDIATE`
transaction (store.py `_transaction`): a group's admission commits its row, its N jobs,
their N budget reservations and its N attempt rows together, or nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from gateway.store.attempts import (
    AttemptGroupRow,
    AttemptRow,
    CheckResult,
    DuplicateActiveGroup,
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

# A migration (sql.py names its version), additive: two new tables. The partial unique
# index is the arbiter of group dedup: one running group per dedup key, whoever races.
ATTEMPTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS attempt_groups (
    group_id TEXT PRIMARY KEY, dedup_key TEXT NOT NULL, principal TEXT,
    prompt TEXT NOT NULL, targets_json TEXT NOT NULL, base_sha TEXT NOT NULL,
    working_dir TEXT NOT NULL, check_json TEXT, check_timeout_s REAL NOT NULL,
    until_rule TEXT NOT NULL, judge_json TEXT, status TEXT NOT NULL,
    winner_job_id TEXT, winner_reason TEXT, judge_job_id TEXT, judge_result_json TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, ended_at REAL)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS attempt_groups_running_key
    ON attempt_groups (dedup_key) WHERE status = 'running'""",
    "CREATE INDEX IF NOT EXISTS attempt_groups_created ON attempt_groups (created_at)",
    """CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT PRIMARY KEY, group_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
    check_state TEXT NOT NULL, check_claimed_by TEXT, check_exit_code INTEGER,
    check_output_tail TEXT, check_duration_s REAL, check_reason TEXT,
    check_started_at REAL, check_ended_at REAL, UNIQUE (group_id, ordinal))""",
)

_GROUP_COLUMNS = (
    "group_id, dedup_key, principal, prompt, targets_json, base_sha, working_dir, check_json, "
    "check_timeout_s, until_rule, judge_json, status, winner_job_id, winner_reason, "
    "judge_job_id, judge_result_json, created_at, updated_at, ended_at")
_ATTEMPT_COLUMNS = (
    "job_id, group_id, ordinal, check_state, check_claimed_by, check_exit_code, "
    "check_output_tail, check_duration_s, check_reason, check_started_at, check_ended_at")

# The partial unique index attempt_groups_running_key decides: a second running group with
# the same key is not inserted (DO NOTHING: no row returned), whoever races.
INSERT_GROUP = f"""
INSERT INTO attempt_groups (group_id, dedup_key, principal, prompt, targets_json, base_sha,
    working_dir, check_json, check_timeout_s, until_rule, judge_json, status, created_at,
    updated_at)
VALUES (:group_id, :dedup_key, :principal, :prompt, :targets_json, :base_sha, :working_dir,
        :check_json, :check_timeout_s, :until_rule, :judge_json, 'running', :now, :now)
ON CONFLICT (dedup_key) WHERE status = 'running' DO NOTHING
RETURNING {_GROUP_COLUMNS}"""

INSERT_ATTEMPT = """
INSERT INTO attempts (job_id, group_id, ordinal, check_state)
VALUES (:job_id, :group_id, :ordinal, 'pending')"""

FIND_RUNNING_GROUP_ID = "SELECT group_id FROM attempt_groups WHERE dedup_key = ? AND status = 'running'"

# What an identical call joins: the running group (any age), or one that ended (done, not
# yet picked or discarded) within the dedup window. Newest first.
FIND_GROUP = f"""
SELECT {_GROUP_COLUMNS} FROM attempt_groups
WHERE dedup_key = :dedup_key
  AND (status = 'running' OR (status = 'done' AND ended_at >= :now - :window_s))
ORDER BY created_at DESC, group_id DESC LIMIT 1"""

GET_GROUP = f"SELECT {_GROUP_COLUMNS} FROM attempt_groups WHERE group_id = ?"

LIST_GROUPS = f"""
SELECT {_GROUP_COLUMNS} FROM attempt_groups
WHERE (:principal IS NULL OR principal = :principal) AND (:status IS NULL OR status = :status)
ORDER BY created_at DESC, group_id DESC LIMIT :limit"""

LIST_ATTEMPTS = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE group_id = ? ORDER BY ordinal"
GET_ATTEMPT = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ?"

# Invariant: a check runs at most once. Only a pending check is claimed, by exactly one
# caller (of any number of gateways and adopters racing), who records that it runs it.
CLAIM_CHECK = """
UPDATE attempts SET check_state = 'running', check_claimed_by = :claimer,
    check_started_at = :now
WHERE job_id = :job_id AND check_state = 'pending'"""

# Invariant: a check that never ran is skipped once, and never after it was claimed.
SKIP_CHECK = """
UPDATE attempts SET check_state = 'skipped', check_reason = :reason, check_ended_at = :now
WHERE job_id = :job_id AND check_state = 'pending'"""

# Invariant: a check has one result. Only a running check gets it (from its runner, or from
# an adopter reading the outcome the runner's supervisor left): the first write wins.
RECORD_CHECK = """
UPDATE attempts SET check_state = 'done', check_exit_code = :exit_code,
    check_output_tail = :output_tail, check_duration_s = :duration_s,
    check_reason = :reason, check_ended_at = :now
WHERE job_id = :job_id AND check_state = 'running'"""

# Invariant: a group moves only from the status its caller read (`expected`): of two picks
# (or a pick and the end of the group) exactly one applies; picked and discarded are final.
# And a group has one judge: judge_job_id is set once (a transition that names another
# judge than the one set does not apply), so of gateways racing to start it one claims it.
END_GROUP = """
UPDATE attempt_groups SET status = :status, updated_at = :now,
    winner_job_id = COALESCE(:winner_job_id, winner_job_id),
    winner_reason = COALESCE(:winner_reason, winner_reason),
    judge_job_id = COALESCE(:judge_job_id, judge_job_id),
    judge_result_json = COALESCE(:judge_result_json, judge_result_json),
    ended_at = CASE WHEN :final THEN COALESCE(ended_at, :now) ELSE ended_at END
WHERE group_id = :group_id AND status IN (SELECT value FROM json_each(:expected))
  AND (:judge_job_id IS NULL OR judge_job_id IS NULL OR judge_job_id = :judge_job_id)"""


def insert_group(db: sqlite3.Connection, group: NewAttemptGroup, job_ids: Sequence[str],
                 now: float) -> AttemptGroupRow:
    """The group row and its attempt rows (the caller inserts the jobs in the same
    transaction); DuplicateActiveGroup when a running twin holds the key."""
    rows = db.execute(INSERT_GROUP, {**group_params(group), "now": now}).fetchall()
    if not rows:
        existing = db.execute(FIND_RUNNING_GROUP_ID, (group.dedup_key,)).fetchone()
        raise DuplicateActiveGroup(existing[0] if existing else None)
    for ordinal, job_id in enumerate(job_ids):
        db.execute(INSERT_ATTEMPT, {"job_id": job_id, "group_id": group.group_id,
                                    "ordinal": ordinal})
    return group_row(rows[0])


def claim_check(db: sqlite3.Connection, job_id: str, claimer: str, now: float) -> bool:
    return db.execute(CLAIM_CHECK, {"job_id": job_id, "claimer": claimer,
                                    "now": now}).rowcount == 1


def skip_check(db: sqlite3.Connection, job_id: str, reason: str, now: float) -> bool:
    return db.execute(SKIP_CHECK, {"job_id": job_id, "reason": reason,
                                   "now": now}).rowcount == 1


def record_check(db: sqlite3.Connection, job_id: str, result: CheckResult, now: float) -> bool:
    return db.execute(RECORD_CHECK, {
        "job_id": job_id, "exit_code": result.exit_code, "output_tail": result.output_tail,
        "duration_s": result.duration_s, "reason": result.reason, "now": now}).rowcount == 1


# Invariant: a group's end to a notified status (store/outbox.py: `done`) adds its notice in
# the transaction of that end, once: run only after END_GROUP moved the row, and the id
# `group:<group id>:<status>` makes a second add a no-op.
ADD_GROUP_NOTICE = f"""
INSERT INTO completion_notices (id, job_id, provider, status, error, duration_s, created_at,
                                next_attempt_at)
SELECT '{GROUP_PREFIX}' || group_id || ':' || status, COALESCE(winner_job_id, group_id),
       '{GROUP_PROVIDER}', status, substr(winner_reason, 1, {NOTICE_ERROR_CHARS}),
       MAX(COALESCE(ended_at, updated_at) - created_at, 0), :now, :now
FROM attempt_groups WHERE group_id = :group_id AND status = :status
ON CONFLICT (id) DO NOTHING"""


def end_group(db: sqlite3.Connection, end: GroupEnd, now: float) -> bool:
    """END_GROUP, and the group's notice with it when it ends in a notified status (inside
    the caller's transaction: both or neither)."""
    moved = db.execute(END_GROUP, {**end_params(end), "now": now}).rowcount == 1
    if moved and end.status in NOTIFIED_GROUP_STATUSES:
        db.execute(ADD_GROUP_NOTICE, {"group_id": end.group_id, "status": str(end.status),
                                      "now": now})
    return moved


def group_row(row: sqlite3.Row) -> AttemptGroupRow:
    return AttemptGroupRow.from_mapping(_mapping(row))


def attempt_row(row: sqlite3.Row) -> AttemptRow:
    return AttemptRow.from_mapping(_mapping(row))


def _mapping(row: sqlite3.Row) -> dict[str, Any]:
    return {name: row[name] for name in row.keys()}  # noqa: SIM118 - a Row iterates values

