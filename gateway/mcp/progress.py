"""Progress notifications of a tool call that waits on a job (a sync request, llm_job_wait)."""

from __future__ import annotations

import contextlib
import time

from mcp.server.mcpserver import Context

PROGRESS_STEP = 0.001  # progress values must strictly increase between notifications


class Progress:
    """One waiting call's progress: the job's output bytes so far, made strictly increasing
    (the protocol wants it) by a tiny step when no output came."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.started = time.monotonic()
        self.last = -PROGRESS_STEP

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    async def report(self, output_bytes: int, message: str) -> None:
        """A progress notification: a no-op unless the caller sent a progress token, and a
        failure to notify never fails the call."""
        value = max(float(output_bytes), self.last + PROGRESS_STEP)
        self.last = value
        with contextlib.suppress(Exception):
            await self.ctx.report_progress(round(value, 3), None, message)
