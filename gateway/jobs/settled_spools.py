"""Removing the spools of ended jobs: in batches, just after their answers went out.

Once a job's terminal row holds its output, nothing in its spool is anyone's evidence any
more, and its directory goes. That removal used to start in a worker thread the moment the
row was written, which is also the moment the job's waiter starts its answer: the thread's
unlinks took the GIL back and forth with the event loop writing that answer, about 0.6-0.9
ms on every sync request of a 2-core box (bench/README.md, the cost rows). Removals now wait
REMOVAL_DELAY_S, long enough for the answer to be out, and all the spools that ended
meanwhile (a burst's) go in one thread hop. A gateway that stops first removes what is
pending on its way out (`flush`); one that is killed leaves it to the sweep of settled
spools (leases.py).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from gateway.jobs.run import spool

# After a job's terminal write, how long its spool waits to be removed: an answer takes a
# few milliseconds to go out, and a burst's jobs ending within this go in one batch.
REMOVAL_DELAY_S = 0.05


class SettledSpools:
    """The spools of this gateway's ended jobs, waiting to be removed. Use it on one event
    loop (the driver's)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._pending: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._removing: set[asyncio.Task[None]] = set()

    def add(self, job_id: str) -> None:
        """Remove the spool of `job_id` (its row is terminal and holds its output) soon."""
        self._pending.add(job_id)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(REMOVAL_DELAY_S, self._start)

    def _start(self) -> None:
        self._timer = None
        job_ids, self._pending = self._pending, set()
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._remove, job_ids), name="settled-spools")
        self._removing.add(task)
        task.add_done_callback(self._removing.discard)

    def _remove(self, job_ids: set[str]) -> None:
        for job_id in job_ids:
            shutil.rmtree(spool.job_dir(self._root, job_id), ignore_errors=True)

    async def flush(self) -> None:
        """Remove what is pending now, and wait for removals under way (the gateway stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            self._start()
        if self._removing:
            await asyncio.gather(*self._removing)
