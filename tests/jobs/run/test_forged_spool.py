"""A forged or tampered spool is never adopted (issue 23, item 2): adoption checks what it
adopts (file ownership and mode, no symlinks, the launch token, the claimed supervisor's
pid, start time, owner and command line). The job is left alone: not completed with the
forged answer, and the process the claim names is not signalled.

A real store (SQLite file and PostgreSQL), a real gateway adopting, real processes; the
spool is written as its (dead) owner's gateway and supervisor would have, then tampered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gateway import platform, proc
from gateway.config import Settings
from gateway.jobs.run import spool
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.forks import ZYGOTE_BOOT
from gateway.model import InstanceRow, JobStatus, NewJob
from gateway.store import open_store
from tests.children import reap
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, here, job_row, leases_of, store_of

pytestmark = pytest.mark.anyio

TOKEN = "a" * 32


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours in a group of its own that a forged claim names: not a supervisor."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    try:
        yield child
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def fake_supervisor() -> Iterator[subprocess.Popen[bytes]]:
    """A process with a zygote's command line, as every supervisor it forks has: the
    genuine case."""
    chosen = platform.supervisor_spec()  # started exactly as forks.py starts a zygote
    child = subprocess.Popen([sys.executable, "-I", "-S", "-c", ZYGOTE_BOOT,
                              str(chosen["platform"]), *chosen["platform_path"]],
                             stdin=subprocess.PIPE, start_new_session=True)
    try:
        yield child
    finally:
        reap(child)  # EOF on its stdin: a zygote exits by itself


def tamper_token(attempt: Path) -> None:
    start = sup.read_record(attempt, sup.START_NAME) or {}
    os.unlink(attempt / sup.START_NAME)
    sup.write_record(attempt, sup.START_NAME, {**start, "token": "b" * 32})


def tamper_symlink(attempt: Path) -> None:
    elsewhere = attempt.parent / "elsewhere"
    elsewhere.write_bytes(b"the forged answer")
    os.unlink(attempt / sup.STDOUT_NAME)
    os.symlink(elsewhere, attempt / sup.STDOUT_NAME)


def tamper_mode(attempt: Path) -> None:
    (attempt / sup.END_NAME).chmod(0o644)


def tamper_owner(attempt: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    os.chown(attempt / sup.END_NAME, 65534, 65534)


TAMPERS: dict[str, Callable[[Path], None]] = {
    "a token of another launch": tamper_token, "a symlinked stdout": tamper_symlink,
    "a record others can read": tamper_mode, "a record of another user": tamper_owner,
}


async def forged_job(settings: Settings, n: int, claimed: subprocess.Popen[bytes]) -> tuple[str, Path]:
    """A running job of a dead owner of this host whose spool names `claimed` as its
    supervisor and holds an end record and an answer."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = proc.process_start_time(dead.pid)
    dead.wait()
    owner = f"dead-owner-{n}"
    request: dict[str, Any] = {"provider": "claude", "prompt": f"forged {n}", "model": None,
               "working_dir": None, "session_id": None, "options": {}}
    job = NewJob(id=f"00000000-0000-4000-8000-{n:012d}", provider="claude",
                 request_key=f"forged-{n}", owner_instance=owner,
                 request_json=json.dumps(request), **here())
    store = await open_store(settings)
    try:
        await store.register_instance(InstanceRow(
            instance_id=owner, pid=dead.pid, pid_started_at=started, role="stdio",
            version="test", **here()), 0.05)
        await store.insert_job(job, 0.05)
        assert await store.mark_running(job.id, owner, 0.05)
        row = await store.get_job(job.id)
        assert row is not None
    finally:
        await store.close()
    attempt = spool.run_dir(spool.spool_root(settings.state_dir), row)
    spool.make_run_dir(attempt)
    sup.write_record(attempt, sup.RUN_NAME, {
        "version": sup.RECORD_VERSION, "token": TOKEN, "job_id": job.id,
        "argv": ["claude", "-p"], "cwd": str(attempt), "temp_cwd": False, "stdin": False,
        "timeout_s": 600.0, "idle_timeout_s": None, "max_output_bytes": 1 << 20,
        "kill_grace_s": 1.0})
    claimed_at = proc.process_start_time(claimed.pid)
    sup.claim_record(attempt, sup.START_NAME, {
        "version": sup.RECORD_VERSION, "kind": "supervisor", "pid": claimed.pid,
        "pgid": claimed.pid, "started_at": claimed_at, "at": time.time(), "token": TOKEN})
    for name, data in ((sup.STDOUT_NAME, b"the forged answer"), (sup.STDERR_NAME, b"")):
        fd = os.open(attempt / name, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, data)
        os.close(fd)
    sup.write_record(attempt, sup.END_NAME, {
        "version": sup.RECORD_VERSION, "why": sup.WHY_EXIT, "returncode": 0,
        "pid": claimed.pid, "pgid": claimed.pid, "duration_s": 1.0})
    return job.id, attempt


async def assert_not_adopted(start_gateway: StartGateway, settings: Settings, job_id: str,
                             claimed: subprocess.Popen[bytes]) -> None:
    gateway = await start_gateway(settings)  # its start ran one adoption sweep already
    assert await leases_of(gateway).adopter.sweep() == 0
    row = await job_row(store_of(gateway), job_id)
    assert row.status is JobStatus.RUNNING and row.owner_instance != gateway.instance_id
    assert psutil.Process(claimed.pid).status() != psutil.STATUS_ZOMBIE  # never signalled


@pytest.mark.parametrize("tamper", list(TAMPERS))
async def test_a_tampered_spool_is_never_adopted(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    fake_supervisor: subprocess.Popen[bytes], tamper: str,
) -> None:
    settings = make_settings()
    job_id, attempt = await forged_job(settings, 1, fake_supervisor)
    TAMPERS[tamper](attempt)
    await assert_not_adopted(start_gateway, settings, job_id, fake_supervisor)


async def test_a_claim_naming_a_process_that_is_not_a_supervisor_is_never_adopted(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    victim: subprocess.Popen[bytes],
) -> None:
    # The forged claim named a root process; adopted, its group was SIGKILLed.
    settings = make_settings()
    job_id, _ = await forged_job(settings, 2, victim)
    await assert_not_adopted(start_gateway, settings, job_id, victim)


async def test_an_untampered_spool_of_the_same_shape_is_adopted(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    fake_supervisor: subprocess.Popen[bytes],
) -> None:
    # The control: the same spool untouched passes every check, so the checks above are
    # what refused (the claimed process looks like a supervisor; it ends the run here).
    settings = make_settings()
    job_id, _ = await forged_job(settings, 3, fake_supervisor)
    gateway = await start_gateway(settings)
    row = await job_row(store_of(gateway), job_id)
    assert row.owner_instance == gateway.instance_id
