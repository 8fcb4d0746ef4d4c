"""Who made a job, and who may see it over MCP (#23 item 4).

A job (and so an MCP task) belongs to the principal that made it: `local` for a stdio
session or an HTTP gateway without a token (any local process can reach those anyway), else
`token:` plus a hash of the HTTP gateway's bearer token (the token itself is never stored).
Over MCP another principal's job does not exist: `llm_job_*` and `tasks/get`, `tasks/result`,
`tasks/cancel` answer "not found" and `llm_job_list` and `tasks/list` leave it out, as the
MCP Tasks specification's security guidance asks. A row from before schema 4 has no
principal and is visible to `local` only. The operator CLI (`agent-cli-gateway jobs`) reads
the store directly and sees every job: whoever can read the store is its operator.

Gateways sharing a store see each other's jobs exactly when they share the principal: every
stdio gateway is `local`, and HTTP gateways with the same token are one principal.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from gateway.model import ErrorKind, GatewayError, JobRow

if TYPE_CHECKING:
    from gateway.jobs.manager import JobManager

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


async def visible_jobs(manager: JobManager, principal: str, *, limit: int,
                       status: str | None = None, provider: str | None = None) -> list[JobRow]:
    """The newest `limit` jobs `principal` may see, filtered in the store query (before its
    LIMIT), so a page of `llm_job_list` or `tasks/list` is full whenever that many exist."""
    return await manager.list_jobs(status=status, provider=provider, limit=limit,
                                   principal=principal, unowned_too=sees_unowned(principal))


def not_found(job_id: str) -> GatewayError:
    """The answer for another principal's job: exactly as if it did not exist."""
    return GatewayError(ErrorKind.JOB_NOT_FOUND,
                        f"No job with id {job_id!r}. Check the id (llm_job_list shows recent "
                        f"jobs).")


def owned(principal: str, row: JobRow) -> JobRow:
    """`row` if `principal` may see it, else the not-found error."""
    if not may_see(principal, row):
        raise not_found(row.id)
    return row
