"""The spools of ended jobs go in batches, after their answers, and none is left by a stop
(gateway/jobs/settled_spools.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.jobs import settled_spools
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run import spool
from gateway.jobs.settled_spools import SettledSpools
from gateway.model import JobStatus
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, job_row
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

DONE_S = 20.0


def spool_of(root: Path, job_id: str) -> Path:
    attempt = spool.job_dir(root, job_id) / "0"
    attempt.mkdir(parents=True)
    (attempt / "stdout").write_text("the answer")
    return spool.job_dir(root, job_id)


async def test_ended_spools_go_together_and_no_other(tmp_path: Path) -> None:
    settled = SettledSpools(tmp_path)
    ended = [spool_of(tmp_path, f"job-{i}") for i in range(5)]
    running = spool_of(tmp_path, "running")
    for directory in ended:
        settled.add(directory.name)
    assert all(directory.exists() for directory in ended)  # not at once: after the answer
    await wait_for(lambda: not any(directory.exists() for directory in ended), DONE_S)
    assert running.exists()


async def test_a_flush_removes_what_is_pending_before_it_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settled_spools, "REMOVAL_DELAY_S", 3600.0)  # never on its own
    settled = SettledSpools(tmp_path)
    first, second = spool_of(tmp_path, "first"), spool_of(tmp_path, "second")
    settled.add(first.name)
    settled.add(second.name)
    await settled.flush()
    assert not first.exists() and not second.exists()
    await settled.flush()  # nothing pending: nothing to do


async def test_a_stopping_gateway_leaves_no_spool_of_its_ended_jobs(
        make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settled_spools, "REMOVAL_DELAY_S", 3600.0)  # only the stop removes it
    gateway = await start_gateway(make_settings())
    manager = await gateway.manager()
    sub = await manager.submit("claude", SubmitRequest(prompt="ends before the stop"))
    row = await manager.reads.wait(sub.job.id, DONE_S)
    assert row is not None and row.status is JobStatus.COMPLETED
    assert (await job_row(manager.store, sub.job.id)).output  # the row holds the answer
    directory = spool.job_dir(manager.spool_root, sub.job.id)
    assert directory.exists()  # pending
    await gateway.stop()
    assert not directory.exists()
