"""Nothing is left behind by a launch that never happened (issue 23, item 12): no temp cwd
of a run re-queued before its supervisor's claim, no attempt dir of a woken owner whose
queued -> running CAS was refused.

Real gateways on a real store (SQLite file and PostgreSQL), real supervisors and fake CLIs;
the peer and the dead owner are written into the store as their gateways would have.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import proc
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run import spool
from gateway.model import Completion, InstanceRow, JobStatus, NewJob
from gateway.store.base import TakeOver
from tests.jobs.conftest import (
    FakeLog,
    MakeSettings,
    StartGateway,
    claude_request_json,
    here,
    job_row,
    left_running,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

DONE_S = 20.0


async def test_a_run_requeued_after_its_temp_cwd_was_made_leaves_no_temp_cwd(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Its owner was SIGKILLed after it made the run's temp cwd and before the supervisor's
    # claim; the re-queue removed the spool, the only record of that dir, and it stayed.
    settings = make_settings()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = proc.process_start_time(dead.pid)
    dead.wait()
    job = NewJob(id="00000000-0000-4000-8000-000000000023", provider="claude",
                 request_key="leftover-temp-cwd", owner_instance="killed-owner",
                 request_json=claude_request_json("re-queued before its claim"), **here())
    attempt = await left_running(settings, job, InstanceRow(
        instance_id="killed-owner", pid=dead.pid, pid_started_at=started, role="stdio",
        version="test", **here()))
    temp_cwd = spool.make_temp_cwd(attempt)  # what the runner does, then it was killed
    assert temp_cwd.is_dir()
    manager = await (await start_gateway(settings)).manager()

    async def completed() -> bool:
        return (await manager.reads.get(job.id)).status is JobStatus.COMPLETED

    await wait_for(completed, DONE_S)
    assert fake_log.prompts() == ["re-queued before its claim"]
    assert not temp_cwd.exists()


async def test_a_woken_owner_whose_cas_is_refused_leaves_no_attempt_dir(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An owner stopped while its job waited: a peer re-queued it, ran it and removed its
    # spool; the owner woke, made its old attempt's dir, had its CAS refused and kept it.
    # The job waits for the one run slot (a job admitted into a free slot has no CAS).
    settings = make_settings(limits={"max_running_jobs": 1, "max_running_per_provider": 1})
    manager = await (await start_gateway(settings)).manager()
    store = manager.store
    made: list[Path] = []
    real_make, real_mark = spool.make_run_dir, store.mark_running

    def make_run_dir(path: Path) -> bool:  # the owner's launch, on its event loop
        made.append(path)
        return real_make(path)

    async def peer_ran_it_meanwhile(job_id: str, instance_id: str, ttl_s: float) -> bool:
        if instance_id == manager.instance_id:  # the owner's CAS: the peer went first
            await peer(job_id)
            real_make(made[-1])  # the owner made its old attempt's dir after the removal
        return await real_mark(job_id, instance_id, ttl_s)

    async def peer(job_id: str) -> None:
        row = await store.requeue_job(TakeOver(
            job_id=job_id, expected_owner=manager.instance_id,
            expected_status=JobStatus.QUEUED, instance_id="peer",
            ttl_s=settings.lease.ttl_s, **here()))
        assert row is not None
        assert await store.mark_running(job_id, "peer", settings.lease.ttl_s)
        assert await store.complete(job_id, "peer", Completion(
            status=JobStatus.COMPLETED, exit_code=0, output="the peer's answer"))
        shutil.rmtree(spool.job_dir(manager.spool_root, job_id), ignore_errors=True)

    monkeypatch.setattr(spool, "make_run_dir", make_run_dir)
    monkeypatch.setattr(store, "mark_running", peer_ran_it_meanwhile)
    await manager.submit("claude", SubmitRequest(prompt="holds the slot @sleep=0.5"))
    sub = await manager.submit("claude", SubmitRequest(prompt="run by the peer"))
    await wait_for(lambda: sub.job.id not in manager.local_job_ids(), DONE_S)
    row = await job_row(store, sub.job.id)
    assert (row.status, row.owner_instance) == (JobStatus.COMPLETED, "peer")
    assert "run by the peer" not in fake_log.prompts()
    assert not spool.job_dir(manager.spool_root, sub.job.id).exists()
