"""A job whose owner is killed each time it launches it (a poison job, issue #22) ends
`failed` (`requeue_limit`) after `lease.max_requeues`, instead of taking every gateway down;
the gateway that ends it serves on. Real gateway processes (tests/jobs/poison_gateway.py:
each dies by SIGKILL as it launches the job), a real store, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from gateway.config import Settings
from gateway.model import ErrorKind, JobStatus
from gateway.store import open_store
from tests.children import Children
from tests.jobs.conftest import FakeLog, MakeSettings
from tests.jobs.poison_gateway import POISON_ENV
from tests.jobs.test_detach import REPO, claude_job

pytestmark = pytest.mark.anyio

MAX_REQUEUES = 2
GATEWAY_WAIT_S = 60.0  # a gateway process starting, adopting, dying on a loaded 2-core box
POLL_S = 0.05


def start_poison_gateway(settings: Settings, tmp_path: Path, job_id: str,
                         children: Children) -> subprocess.Popen[bytes]:
    path = tmp_path / "poison-settings.pickle"
    path.write_bytes(pickle.dumps(settings))
    return children.track(subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.poison_gateway", str(path)], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, POISON_ENV: job_id}))


async def test_a_job_whose_owner_dies_at_each_launch_ends_failed_and_its_last_gateway_serves(
    make_settings: MakeSettings, fake_log: FakeLog, tmp_path: Path, children: Children
) -> None:
    settings = make_settings(lease={"max_requeues": MAX_REQUEUES})
    job = claude_job(31, "poison: it kills its gateway", "ghost")  # its owner is gone
    store = await open_store(settings)
    try:
        await store.insert_job(job, settings.lease.ttl_s)
        # One gateway after another takes it over (a re-queue: it never started) and dies
        # launching it; the one after the bound ends it instead of launching it.
        killed = []
        for _attempt in range(MAX_REQUEUES):
            gateway = start_poison_gateway(settings, tmp_path, job.id, children)
            assert gateway.wait(GATEWAY_WAIT_S) == -9  # SIGKILLed at launch
            killed.append(gateway.pid)
            row = await store.get_job(job.id, with_output=False)
            assert row is not None and row.status is JobStatus.RUNNING
            assert row.requeue_count == len(killed)
        last = start_poison_gateway(settings, tmp_path, job.id, children)
        try:
            deadline = time.monotonic() + GATEWAY_WAIT_S
            while (row := await store.get_job(job.id, with_output=False)) is not None \
                    and row.status.is_active:
                assert last.poll() is None, "the last gateway died: it launched the poison job"
                assert time.monotonic() < deadline, row
                await anyio.sleep(POLL_S)
            assert row is not None and row.status is JobStatus.FAILED
            assert row.error_kind == ErrorKind.REQUEUE_LIMIT
            assert row.requeue_count == MAX_REQUEUES and f"{MAX_REQUEUES} re-queues" in (row.error or "")
            reasons = json.loads(row.requeue_reasons or "[]")
            assert [r["reason"] for r in reasons] == ["owner_collected", "owner_dead"]
            assert fake_log.prompts() == []  # the CLI never ran
            # The gateway that ended it is still serving: alive, and renewing its lease.
            failed_at = await store.now()
            deadline = time.monotonic() + GATEWAY_WAIT_S
            while True:
                assert last.poll() is None
                mine = [i for i in await store.list_instances() if i.pid == last.pid]
                if mine and mine[0].heartbeat_at is not None \
                        and mine[0].heartbeat_at.timestamp() > failed_at:
                    break
                assert time.monotonic() < deadline
                await anyio.sleep(POLL_S)
        finally:
            last.kill()
            last.wait()
    finally:
        await store.close()
