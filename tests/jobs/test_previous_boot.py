"""A job marked running before a reboot (a power loss) is orphaned, never queued again.

Spool records are not fsynced (gateway/jobs/run/supervisor.py): within a boot every process
sees them at once, but after a power loss a missing claim proves nothing, so only a running
row of this boot is re-queued when its spool shows no start. Real gateways on a real store
(SQLite file and PostgreSQL) and fake CLIs; the dead owner is written into the store as its
gateway would have, and its instance row is collected (gone), as after a reboot.
"""

from __future__ import annotations

import pytest

from gateway import proc
from gateway.jobs.run import supervisor as sup
from gateway.model import JobStatus, NewJob
from tests.jobs.conftest import (
    FakeLog,
    MakeSettings,
    StartGateway,
    claude_request_json,
    job_row,
    left_running,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

DONE_S = 20.0
PROMPT = "marked running, never claimed"


@pytest.mark.parametrize("boot", ["this", "previous"])
async def test_an_unclaimed_running_job_is_requeued_only_within_its_boot(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, boot: str
) -> None:
    settings = make_settings()
    boot_id = proc.boot_id() if boot == "this" else "an-earlier-boot"
    job = NewJob(id=f"00000000-0000-4000-8000-00000000{'0001' if boot == 'this' else '0002'}",
                 provider="claude", request_key=f"unclaimed-{boot}", owner_instance="gone-owner",
                 request_json=claude_request_json(PROMPT), hostname=proc.hostname(),
                 boot_id=boot_id)
    # Its owner marked it running and made its attempt dir; then the power went.
    attempt = await left_running(settings, job)
    manager = await (await start_gateway(settings)).manager()

    async def settled() -> bool:
        return (await manager.reads.get(job.id)).status in (JobStatus.COMPLETED, JobStatus.ORPHANED)

    await wait_for(settled, DONE_S)
    row = await job_row(manager.store, job.id)
    if boot == "this":  # the spool speaks for this boot: nothing claimed it, so it ran here
        assert (row.status, row.requeue_count) == (JobStatus.COMPLETED, 1)
        assert fake_log.prompts() == [PROMPT]
    else:  # a claim that was never fsynced may be lost: it is never run again
        assert (row.status, row.requeue_count) == (JobStatus.ORPHANED, 0)
        assert fake_log.spawns() == []
        assert sup.read_record(attempt, sup.START_NAME) is None  # not claimed for a re-queue
