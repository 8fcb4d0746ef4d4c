"""PostgreSQL: worker hosts (issue 42): schemas 11 and 12, the claim of a queued job by a worker, and
the submitting owner's sweeps of remote jobs nobody can take.

A remote job (`runs_on` not NULL) is inserted `queued` and owned by its admitting gateway,
whose heartbeat keeps its lease like any job's. A worker takes it with CLAIM_JOBS: from then
on it is the worker's like any job it admitted itself (its lease, cancel poller, adoption
and re-queue rules), on the worker's host.
"""

from __future__ import annotations

import json

import asyncpg

from gateway.model import JobRow
from gateway.store.protocol_roles import WorkerClaim

# v11: where a job may run, when a worker claimed it and why nobody can now; what an
# instance can run. Additive, each step idempotent. The partial index serves the claim's
# pick and the owner's sweep: only queued remote rows are in it, so it stays tiny.
SCHEMA_V11 = (
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS runs_on text",
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS claimed_at timestamptz",
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unschedulable_reason text",
    "ALTER TABLE gateway_instances ADD COLUMN IF NOT EXISTS capabilities text",
    """CREATE INDEX IF NOT EXISTS jobs_remote_queued ON jobs (created_at)
       WHERE status = 'queued' AND runs_on IS NOT NULL AND claimed_at IS NULL""",
)

# v14: the patch of a worktree job a worker ran, read by the submitting host's diff and
# apply; and the submitting host's request that the worker remove the worktree.
SCHEMA_V14 = (
    """CREATE TABLE IF NOT EXISTS remote_patches (
        job_id text PRIMARY KEY,
        hostname text NOT NULL,
        base_sha text NOT NULL,
        tip text NOT NULL,
        size bigint NOT NULL,
        patch bytea,
        created_at timestamptz NOT NULL DEFAULT now(),
        removal_requested_at timestamptz,
        removed_at timestamptz)""",
    """CREATE INDEX IF NOT EXISTS remote_patches_removals ON remote_patches (hostname)
       WHERE removal_requested_at IS NOT NULL AND removed_at IS NULL""",
)

# Invariant: a job's patch is written once, by the worker that ran it; a second write
# (a re-run after adoption that settles again) changes nothing.
PUT_PATCH = """
INSERT INTO remote_patches (job_id, hostname, base_sha, tip, size, patch)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id) DO NOTHING"""

GET_PATCH = """
SELECT job_id, hostname, base_sha, tip, size, patch,
       removal_requested_at IS NOT NULL AS discard_requested
FROM remote_patches WHERE job_id = $1"""

# Invariant: a removal is requested once (the first apply or discard wins; a second one is
# told it was done already).
REQUEST_REMOVAL = """
UPDATE remote_patches SET removal_requested_at = now()
WHERE job_id = $1 AND removal_requested_at IS NULL"""

WORKTREE_REMOVALS = """
SELECT job_id FROM remote_patches
WHERE hostname = $1 AND removal_requested_at IS NOT NULL AND removed_at IS NULL
ORDER BY removal_requested_at LIMIT 100"""

# Invariant: only a requested, not yet removed worktree is marked removed.
WORKTREE_REMOVED = """
UPDATE remote_patches SET removed_at = now()
WHERE job_id = $1 AND removal_requested_at IS NOT NULL AND removed_at IS NULL"""

_LIGHT = ", ".join(
    "NULL::text AS output" if name == "output"
    else "NULL::text AS result_json" if name == "result_json"
    else f"jobs.{name} AS {name}"
    for name in JobRow.column_names())

PUBLISH_CAPABILITIES = """
UPDATE gateway_instances SET capabilities = $2 WHERE instance_id = $1"""

# Invariant: a queued remote job is claimed by exactly one worker, and only one that meets
# it. The pick locks the rows it takes (FOR UPDATE: a second claimer's pick skips them,
# SKIP LOCKED, instead of waiting, so claimers never queue behind each other); the UPDATE
# then re-checks on the locked row that it is still queued, unclaimed, without a cancel
# request and owned by whom the pick read, so a cancel, the owner's no_worker sweep, the
# reaper or a re-queue that committed first wins and this claim does not apply. What the
# worker meets is judged here, at claim time, from the capabilities it passes now:
#   $4 providers it has (found and logged in), $2 its hostname, $5 its labels (jsonb),
#   $6 the principals it serves (NULL: any).
# A selector is "any", or an object whose every key is met: `host` equal to its hostname,
# `labels` contained in its labels, `repo` (a worktree job's) one of $9, the names and
# origin URLs of the checkouts it holds.
CLAIM_JOBS = f"""
WITH pick AS (
    SELECT id, owner_instance FROM jobs
    WHERE status = 'queued' AND runs_on IS NOT NULL AND claimed_at IS NULL
      AND cancel_requested_at IS NULL
      AND provider = ANY($4::text[])
      AND ($6::text[] IS NULL OR principal = ANY($6::text[]))
      AND (runs_on::jsonb = '"any"'::jsonb
           OR (jsonb_typeof(runs_on::jsonb) = 'object'
               AND (NOT runs_on::jsonb ? 'host' OR runs_on::jsonb ->> 'host' = $2)
               AND (NOT runs_on::jsonb ? 'labels' OR runs_on::jsonb -> 'labels' <@ $5::jsonb)
               AND (NOT runs_on::jsonb ? 'repo' OR runs_on::jsonb ->> 'repo' = ANY($9::text[]))))
    ORDER BY created_at, id
    LIMIT $7
    FOR UPDATE SKIP LOCKED)
UPDATE jobs SET owner_instance = $1, hostname = $2, boot_id = $3, claimed_at = now(),
                lease_deadline = now() + make_interval(secs => $8),
                unschedulable_reason = NULL, updated_at = now()
FROM pick
WHERE jobs.id = pick.id AND jobs.status = 'queued' AND jobs.claimed_at IS NULL
  AND jobs.cancel_requested_at IS NULL
  AND jobs.owner_instance IS NOT DISTINCT FROM pick.owner_instance
RETURNING {_LIGHT}"""

# Only while the row is still queued, unclaimed and the caller's: a claim that won first
# is never given a stale reason.
SET_UNSCHEDULABLE = """
UPDATE jobs SET unschedulable_reason = d.reason, updated_at = now()
FROM unnest($2::text[], $3::text[]) AS d(id, reason)
WHERE jobs.id = d.id AND jobs.owner_instance = $1 AND jobs.status = 'queued'
  AND jobs.claimed_at IS NULL AND jobs.runs_on IS NOT NULL
  AND jobs.unschedulable_reason IS DISTINCT FROM d.reason"""

# Invariant: a claimed remote job's plan is written by its claimer only, and only before
# its run can start (status queued: the queued -> running CAS comes after this write); a job
# re-queued to the pool (claimed_at cleared) or taken by another is not touched.
RECORD_WORKTREE_PLAN = """
UPDATE jobs SET request_json = $3, updated_at = now()
WHERE id = $1 AND owner_instance = $2 AND status = 'queued' AND claimed_at IS NOT NULL
  AND runs_on IS NOT NULL"""

# Invariant: only a remote job that is still queued, unclaimed, without a cancel request and
# the caller's ends `no_worker`, and only once it waited past $2 seconds (from admission, or
# from its last re-queue) on the database clock. A worker's claim that committed first wins
# (claimed_at is set: the row no longer matches); a claim that comes later finds it failed.
FAIL_UNSCHEDULED = """
UPDATE jobs SET status = 'failed', error_kind = 'no_worker',
                error = COALESCE(unschedulable_reason || '. ', '') || $3,
                exit_code = NULL, finished_at = now(), updated_at = now(),
                lease_deadline = NULL
WHERE owner_instance = $1 AND status = 'queued' AND runs_on IS NOT NULL
  AND claimed_at IS NULL AND cancel_requested_at IS NULL
  AND COALESCE(requeued_at, created_at) < now() - make_interval(secs => $2)
RETURNING id"""


# Invariant: only a queued remote job that never started, has no cancel request, and whose
# lease lapsed (its own and its owner's, the reaper's predicate, re-checked on the locked
# row) changes hands: a heartbeat of its owner that committed first keeps it, a claim or a
# cancel that committed first wins. SKIP LOCKED: a row another transaction holds waits for
# the next sweep. The caller (a live gateway) owns it then; any worker may claim it again.
RETURN_TO_POOL = """
UPDATE jobs SET owner_instance = $1, hostname = $2, boot_id = $3, claimed_at = NULL,
                requeued_at = now(), requeue_count = requeue_count + 1,
                lease_deadline = now() + make_interval(secs => $4), updated_at = now()
WHERE id IN (
    SELECT id FROM jobs
    WHERE id = ANY($6::text[]) AND status = 'queued' AND runs_on IS NOT NULL
      AND cancel_requested_at IS NULL AND {lease_expired}
    FOR UPDATE SKIP LOCKED)
RETURNING id"""


async def claim_jobs(conn: asyncpg.Connection, claim: WorkerClaim,
                     limit: int) -> list[JobRow]:
    if limit <= 0 or not claim.providers:
        return []
    rows = await conn.fetch(
        CLAIM_JOBS, claim.instance_id, claim.hostname, claim.boot_id,
        list(claim.providers), json.dumps(dict(claim.labels)),
        list(claim.principals) if claim.principals is not None else None, limit,
        float(claim.ttl_s), list(claim.repos))
    return [JobRow.from_mapping(row) for row in rows]
