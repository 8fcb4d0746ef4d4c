"""Telling a connected session that its job ended (issue 40): the session that submitted a
job (an async request, or a sync one that was deferred) and is still connected gets a
`notifications/message` (level `info`, logger `agent-cli-gateway`) whose data is the job's
notice, so a client that shows server log messages shows it.

A watch waits on the job as `llm_job_wait` does (its end event here; the store's notice or
the poll for a job another gateway took over), for as long as the job runs. A session that
has gone away makes the send fail, which ends the watch quietly: the outbox's sinks, not
this message, are the durable way to be told.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:  # the job machinery loads after tools/list is answered
    from gateway.jobs.reads import JobReads

log = structlog.get_logger(__name__)

LOGGER_NAME = "agent-cli-gateway"
WATCH_STEP_S = 50.0  # one wait of a watch (re-armed while the job runs)
MAX_WATCHES = 1000  # jobs watched at once per server: a bound on the tasks, not a limit on jobs


class JobWatches:
    """The watches of one server; each task is held here until it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, session: Any, reads: JobReads, job_id: str) -> None:
        """Tell `session` when job `job_id` ends (no-op past MAX_WATCHES or with no session)."""
        if session is None or len(self._tasks) >= MAX_WATCHES:
            return
        task = asyncio.create_task(_tell_when_done(session, reads, job_id),
                                   name=f"watch-{job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _tell_when_done(session: Any, reads: JobReads, job_id: str) -> None:
    from gateway.store.outbox import notice_of  # deferred: start-up (the store loads later)

    try:
        row = await reads.wait_end(job_id, WATCH_STEP_S)
    except Exception as exc:  # the store is down for good, the job was purged: stop watching
        log.info("job watch ended", action="job_watch", job_id=job_id, error=repr(exc))
        return
    with contextlib.suppress(Exception):  # the session left: nobody to tell
        await session.send_log_message("info", notice_of(row).payload(), logger=LOGGER_NAME)
