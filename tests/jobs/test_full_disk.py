"""A full state filesystem (issue 15, item 7), on a real small filesystem: a tmpfs of a few
MiB holds the SQLite file and the spool. Mounting needs root; the suite runs as root here
and in CI, so these tests never skip."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gateway.jobs.full_store import FULL_STORE_KEPT_BYTES
from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, JobStatus
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

FS_SIZE = "4m"  # the SQLite file and one spool fit, a large output's second copy does not
MIB = 1024 * 1024


@pytest.fixture
def small_state_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small-fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE},mode=0700", "tmpfs",
                    str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("output_bytes", [3 * MIB, 6 * MIB],
                         ids=["fits_the_spool_not_the_store", "fills_the_filesystem"])
async def test_full_disk_ends_the_run_truncated_frees_its_spool_and_keeps_serving(
    make_settings: MakeSettings, start_gateway: StartGateway, small_state_fs: Path, output_bytes: int
) -> None:
    """Regression: one large output on a full state filesystem made `complete` retry
    "database or disk is full" forever; heartbeats failed, admission went off, and the
    spool, removed only after a successful terminal write, kept the disk full across
    restarts. Now the run ends (failed, output_limit, truncated to what fit, a message
    saying why), its spool is freed, and the gateway serves the next request."""
    db = small_state_fs / "state" / "jobs.db"
    settings = make_settings(persistence={"backend": "sqlite", "path": str(db)})
    gw = await start_gateway(settings)
    manager = await gw.manager()
    big = await manager.submit("claude", SubmitRequest(prompt=f"big @bytes={output_bytes}"))
    row = await manager.reads.wait(big.job.id, 60)
    assert row.status == JobStatus.FAILED, (row.status, row.error)
    assert row.error_kind == ErrorKind.OUTPUT_LIMIT and row.truncated
    assert row.error is not None and "disk is full" in row.error
    assert row.output_bytes <= FULL_STORE_KEPT_BYTES
    page = await manager.reads.read_result(big.job.id, raw=True)
    assert page.total_bytes == row.output_bytes and set(page.output) <= {"x"}
    # The row holds what was kept: the spool goes just after the job's end.
    await wait_for(lambda: not (manager.spool_root / big.job.id).exists(), 10)
    # The space is back: the heartbeat renews, admission is on, the next job completes.
    await wait_for(lambda: manager.admitting, 20)
    small = await manager.submit("claude", SubmitRequest(prompt="small after a full disk"))
    done = await manager.reads.wait(small.job.id, 30)
    assert done.status == JobStatus.COMPLETED, done.error


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_provider_that_keeps_writing_on_a_full_disk_is_stopped_not_left_running(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, small_state_fs: Path
) -> None:
    """ENOSPC ends the run: a CLI that ignores its failing writes (and would run until its
    timeout, holding a slot and the disk) is stopped with the output written so far."""
    db = small_state_fs / "state" / "jobs.db"
    gw = await start_gateway(make_settings(persistence={"backend": "sqlite", "path": str(db)}))
    manager = await gw.manager()
    sub = await manager.submit("claude", SubmitRequest(
        prompt=f"stubborn @bytes={6 * MIB} @enospc-retry", timeout_s=600))
    row = await manager.reads.wait(sub.job.id, 60)
    assert row.status == JobStatus.FAILED and row.error_kind == ErrorKind.OUTPUT_LIMIT
    assert row.truncated and row.error is not None and "full" in row.error
    pid = fake_log.spawns()[0]["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    await wait_for(lambda: not (manager.spool_root / sub.job.id).exists(), 10)


async def test_a_full_disk_is_reported_as_store_full_and_changes_nothing(
    small_state_fs: Path,
) -> None:
    """The store tells a full disk apart from an outage (StoreFull): a retry of the same
    write cannot succeed, so the manager writes less instead of retrying forever."""
    from gateway.model import Completion, NewJob, OutputFile
    from gateway.store.base import StoreFull
    from gateway.store.sqlite.store import SqliteJobStore

    store = SqliteJobStore(small_state_fs / "jobs.db")
    await store.open()
    try:
        job = NewJob(id="full-1", provider="claude", request_key="k", owner_instance="me")
        await store.insert_job(job, 60)
        spool = small_state_fs / "out"
        with spool.open("wb") as fh:  # fills most of the filesystem
            fh.write(b"x" * (3 * MIB))
        output = OutputFile(spool, 3 * MIB)
        with pytest.raises(StoreFull, match="full"):
            await store.complete(job.id, "me", Completion(
                status=JobStatus.COMPLETED, exit_code=0, output=output, output_bytes=3 * MIB))
        row = await store.get_job(job.id)
        assert row is not None and row.status == JobStatus.QUEUED and row.output is None
    finally:
        await store.close()
