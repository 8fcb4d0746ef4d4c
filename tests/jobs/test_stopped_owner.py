"""An owner stopped with SIGSTOP past `ttl_s + instance_gc_s` is alive, not gone (issue 23,
item 5): its instance row is not collected, so its work is neither re-sent nor re-run.

Real store (SQLite file and PostgreSQL), real processes for the owners, a real gateway
judging them; the owners' rows are written as their gateways would have.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gateway import proc
from gateway.jobs.run.spool import run_dir, spool_root
from gateway.model import InstanceRow, JobStatus, NewJob
from gateway.store import open_store
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

DONE_S = 20.0


@pytest.fixture
def stopped_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this host, alive and SIGSTOPped (the stopped owner)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.kill(child.pid, signal.SIGSTOP)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def owner_row(instance_id: str, pid: int, started_at: float | None) -> InstanceRow:
    return InstanceRow(instance_id=instance_id, pid=pid, pid_started_at=started_at,
                       role="stdio", version="test", hostname=proc.hostname(),
                       boot_id=proc.boot_id())


def marked_running_job(n: int, owner: str) -> NewJob:
    request: dict[str, Any] = {"provider": "claude", "prompt": f"owner test {n}", "model": None,
               "working_dir": None, "session_id": None, "options": {}}
    return NewJob(id=f"00000000-0000-4000-8000-{n:012d}", provider="claude",
                  request_key=f"stopped-owner-{n}", owner_instance=owner,
                  request_json=json.dumps(request), hostname=proc.hostname(),
                  boot_id=proc.boot_id())


async def test_an_owner_stopped_past_ttl_and_instance_gc_keeps_its_row_and_its_work(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    stopped_process: subprocess.Popen[bytes],
) -> None:
    # Its row was collected and adoption read "collected" as proven gone: its in-flight API
    # call was sent again, and its runs could be taken from under it. A dead owner beside it
    # shows the sweeps did run: its row is collected and its job re-queued and run.
    settings = make_settings()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_started = proc.process_start_time(dead.pid)
    dead.wait()
    store = await open_store(settings)
    try:
        stopped = owner_row("stopped-owner", stopped_process.pid,
                            proc.process_start_time(stopped_process.pid))
        for row, n in ((stopped, 1), (owner_row("dead-owner", dead.pid, dead_started), 2)):
            await store.register_instance(row, 0.05)
            job = marked_running_job(n, row.instance_id)
            await store.insert_job(job, 0.05)
            assert await store.mark_running(job.id, row.instance_id, 0.05)
            # Marked running, its spool dir made, no supervisor's claim yet: in flight.
            inserted = await store.get_job(job.id)
            assert inserted is not None
            run_dir(spool_root(settings.state_dir), inserted).mkdir(parents=True)
    finally:
        await store.close()
    manager = await (await start_gateway(settings)).manager()
    control = marked_running_job(2, "dead-owner").id

    async def control_settled() -> bool:
        row = await manager.reads.get(control)
        instances = {i.instance_id for i in await manager.store.list_instances()}
        return row.status is JobStatus.COMPLETED and "dead-owner" not in instances

    await wait_for(control_settled, DONE_S)
    instances = {i.instance_id for i in await manager.store.list_instances()}
    assert "stopped-owner" in instances  # past ttl_s + instance_gc_s, but alive
    owned = await manager.reads.get(marked_running_job(1, "stopped-owner").id)
    assert owned.owner_instance == "stopped-owner" and owned.requeued_at is None
    assert fake_log.prompts() == ["owner test 2"]  # the stopped owner's run never ran here
