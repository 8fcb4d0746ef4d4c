"""Who made a job, and who may see it over MCP (#23 item 4).

A job (and so an MCP task) belongs to the principal that made it: `local` for a stdio
session or an HTTP gateway without a token (any local process can reach those anyway), else
`token:` plus a hash of the HTTP gateway's bearer token (the token itself is never stored).
Over MCP another principal's job does not exist: `llm_job_*` and `tasks/get`, `tasks/result`,
`tasks/cancel` answer "not found" and `llm_job_list` and `tasks/list` leave it out, as the
MCP Tasks specification's security guidance asks. The operator CLI (`agent-cli-gateway
jobs`) reads the store directly and sees every job: whoever can read the store is its operator.

A *legacy* job has no principal: 0.1.0 recorded none (the column came with schema 4), and a
0.1.0 gateway still serving the store during an upgrade keeps writing such rows, so no
migration can stamp them once and for all. Who made one is unknown, so it stays with `local`
(stdio, and an HTTP gateway without a token: any local process could read the store anyway)
and the operator CLI. A bearer-token client is never given one (any holder of any token would
read every 0.1.0 job), but it is told why instead of a bare `job_not_found`: the error kind
`legacy_job` names the job's age and where to read it. That says a job with this id exists
and nothing else; job ids are random UUIDs, so only who was given the id learns it. Listings
leave legacy jobs out for such a client, like any job that is not its own.

Gateways sharing a store see each other's jobs exactly when they share the principal: every
stdio gateway is `local`, and HTTP gateways with the same token are one principal.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from gateway.model import ErrorKind, GatewayError, JobRow

if TYPE_CHECKING:
    from gateway.jobs.reads import JobReads

LOCAL = "local"


def principal_of(token: str | None) -> str:
    """The principal of a gateway serving with this bearer token (None: no token)."""
    if not token:
        return LOCAL
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def sees_unowned(principal: str) -> bool:
    """Whether `principal` also sees the rows from before schema 4 (no principal): local
    callers only. The store's listing filter takes this as `unowned_too`."""
    return principal == LOCAL


def may_see(principal: str, row: JobRow) -> bool:
    """Whether `principal` may see this job: its own, or a row from before schema 4 when
    the caller is local."""
    return row.principal == principal or (row.principal is None and sees_unowned(principal))


async def visible_jobs(reads: JobReads, principal: str, *, limit: int,
                       status: str | None = None, provider: str | None = None) -> list[JobRow]:
    """The newest `limit` jobs `principal` may see, filtered in the store query (before its
    LIMIT), so a page of `llm_job_list` or `tasks/list` is full whenever that many exist."""
    return await reads.list_jobs(status=status, provider=provider, limit=limit,
                                 principal=principal, unowned_too=sees_unowned(principal))


def not_found(job_id: str) -> GatewayError:
    """The answer for another principal's job: exactly as if it did not exist."""
    return GatewayError(ErrorKind.JOB_NOT_FOUND,
                        f"No job with id {job_id!r}. Check the id (llm_job_list shows recent "
                        f"jobs).")


def predates_principals(job_id: str) -> GatewayError:
    """The answer for a legacy job (no principal) asked by a bearer-token client: what it
    is and where it can be read, rather than a `job_not_found` that sends the caller
    looking for a typo."""
    return GatewayError(ErrorKind.LEGACY_JOB,
                        f"Job {job_id!r} was made by agent-cli-gateway 0.1.0 (or a 0.1.0 "
                        f"gateway sharing this store), which recorded no owner, so it is "
                        f"not served to a bearer-token HTTP client. Read it through a stdio "
                        f"gateway on the same store (llm_job_result), or on the store's host "
                        f"with `agent-cli-gateway jobs show {job_id}` (`jobs result` prints its "
                        f"answer).")


def owned(principal: str, row: JobRow) -> JobRow:
    """`row` if `principal` may see it; else the legacy-job error for a row without a
    principal, and the not-found error for another principal's."""
    if may_see(principal, row):
        return row
    if row.principal is None:
        raise predates_principals(row.id)
    raise not_found(row.id)
