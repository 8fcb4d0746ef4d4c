"""Leaving with `lease.on_shutdown = "detach"` (docs/architecture.md, Shutdown): the runs go on.

A detaching gateway stops admitting, leaves every supervised run running, extends each
running job's own lease to the latest moment its supervisor could still be running it (so no
gateway on another host orphans it meanwhile), and releases its queued jobs (they stay
queued; once the instance row says stopped, a gateway on this host re-queues them). All of
it in two statements, well inside Claude Code's 500 ms between SIGTERM and SIGKILL. HTTP API
calls have no process to outlive us: they get the drain time, and what is left is re-queued
by the next gateway.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from gateway.jobs.manager import JobManager
from gateway.store.base import StoreUnavailable

log = structlog.get_logger(__name__)

# On top of a detached run's worst case (its remaining timeout_s plus the kill grace): the
# supervisor's stop and exit, a clock step, and the sweep of the gateway that adopts it.
DETACH_MARGIN_S = 30.0
# An HTTP call's lease at detach: the drain time it gets, plus this for the detaching
# gateway to drop it. Past that, the next gateway on the host re-queues it.
HTTP_RELEASE_MARGIN_S = 2.0


async def detach(manager: JobManager, drain_timeout_s: float) -> list[asyncio.Task[None]]:
    """Leave the runs running; returns the tasks of HTTP jobs still in flight (the caller
    gives them what is left of the drain time, then cancels them without a terminal write).
    """
    manager.admission.detach()
    grace = manager.settings.limits.kill_grace_s
    extend: dict[str, float] = {}
    http: list[asyncio.Task[None]] = []
    for job in manager.local_jobs():
        execution = job.execution
        if job.target.transport == "http" and execution is not None:
            extend[job.row.id] = drain_timeout_s + HTTP_RELEASE_MARGIN_S
            if job.task is not None:
                http.append(job.task)
            continue
        if execution is not None:
            # Started (or starting: the supervisor, once spawned, runs on). Kill nothing.
            execution.detach()
            elapsed = time.monotonic() - job.started_mono  # since admission: never too long
            extend[job.row.id] = max(0.0, job.timeout_s - elapsed) + grace + DETACH_MARGIN_S
        elif not job.ticket.granted:
            pass  # waiting for a run slot: released (it stays queued, owned by a stopped row)
        else:
            continue  # being marked running: it starts detached by itself (admission.detached)
        if job.task is not None:
            job.task.cancel()  # no terminal write: the row stays as it is
    try:
        extended = await manager.store.extend_leases(manager.instance_id, extend)
    except StoreUnavailable as exc:
        extended = 0
        log.warning("detach could not extend the leases; they expire as usual",
                    action="detach", error=str(exc))
    log.info("detached", action="detach", runs=len(extend) - len(http), http_jobs=len(http),
             leases_extended=extended)
    return http


async def finish_http(tasks: list[asyncio.Task[None]], budget_s: float) -> None:
    """Let in-flight API calls finish within `budget_s`; cancel the rest without a terminal
    write (their rows stay running until their lease passes; then they are re-queued)."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, budget_s))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1.0)
