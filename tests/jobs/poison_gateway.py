"""A gateway in a process of its own that dies (SIGKILL) each time it launches one job.

Usage: POISON_JOB_ID=<id> python -m tests.jobs.poison_gateway SETTINGS_PICKLE
As tests/jobs/owner_gateway.py (it prints `READY` and serves until killed), except that
launching the job POISON_JOB_ID kills this process at once: after its queued -> running
compare-and-set, before any supervisor claims the run. That is the poison job of issue #22,
one that takes its gateway down as it starts; every other job runs as usual.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from gateway.jobs.run import runner
from gateway.jobs.run.spec import ProcessIdentity
from tests.jobs import owner_gateway

POISON_ENV = "POISON_JOB_ID"

_real_start = runner.ProcessRun.start


async def _start_or_die(self: runner.ProcessRun) -> ProcessIdentity:
    if self.spec.job_id == os.environ.get(POISON_ENV):
        os.kill(os.getpid(), signal.SIGKILL)  # the gateway dies as it launches the run
    return await _real_start(self)


if __name__ == "__main__":
    runner.ProcessRun.start = _start_or_die  # type: ignore[method-assign]
    asyncio.run(owner_gateway.main(sys.argv[1], "claude", "-"))
