"""Instance leases on a real store: the rules of docs/architecture.md, Instance leases, one test each."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import structlog

from gateway import proc
from gateway.jobs.manager import JobManager
from gateway.jobs.requests import SubmitRequest
from gateway.model import ORPHANED_ERROR, ErrorKind, GatewayError, JobRow, JobStatus, NewJob
from gateway.store.base import JobStore
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, job_row, leases_of, store_of
from tests.waiting import scaled, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]


def new_row(owner: str, **kw: Any) -> NewJob:
    job_id = str(uuid.uuid4())
    return NewJob(id=job_id, provider="claude", request_key=job_id, owner_instance=owner, **kw)


async def test_a_fresh_instance_starting_never_orphans_a_live_instances_jobs(
    make_settings: MakeSettings, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    settings = make_settings()
    owner = await (await start_gateway(settings)).manager()
    # Held until the sweeps are done (a fixed sleep ended first when the newcomers were
    # slow to start on a loaded box, and the test then saw `completed`).
    gate = tmp_path / "gate"
    sub = await owner.submit("claude", SubmitRequest(prompt=f"long @until={gate}"))
    # Several fresh instances start (as MCP clients spawn them) and sweep many times over
    # several TTLs while the owner keeps heartbeating.
    newcomers = [await start_gateway(settings) for _ in range(3)]
    deadline = time.monotonic() + 3 * settings.lease.ttl_s
    while time.monotonic() < deadline:
        for gw in newcomers:
            await leases_of(gw).sweep_once()
        row = await owner.reads.get(sub.job.id)
        assert row.status in (JobStatus.QUEUED, JobStatus.RUNNING), row.status
        await anyio.sleep(0.05)
    gate.touch()
    assert (await owner.reads.wait(sub.job.id, scaled(20))).status == JobStatus.COMPLETED


async def test_a_dead_instances_jobs_are_orphaned_within_ttl_plus_sweep(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    settings = make_settings()
    survivor = await start_gateway(settings)
    store = (await survivor.manager()).store
    # The dead owner's last heartbeat is now: its job's lease ends at now + ttl.
    row = await store.insert_job(new_row("dead-instance"), settings.lease.ttl_s)
    t0 = time.monotonic()
    await wait_for(lambda: _status(store, row.id, JobStatus.ORPHANED),
                   timeout=settings.lease.ttl_s + settings.lease.sweep_interval_s + 5)
    elapsed = time.monotonic() - t0
    assert elapsed >= settings.lease.ttl_s * 0.9  # never before its own lease passed
    orphan = await job_row(store, row.id)
    assert (orphan.error_kind, orphan.error) == (ErrorKind.ORPHANED, ORPHANED_ERROR)


async def _status(store: JobStore, job_id: str, status: JobStatus) -> bool:
    row = await store.get_job(job_id)
    return row is not None and row.status == status


async def test_an_http_job_keeps_its_extra_grace(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    settings = make_settings(lease={"http_job_grace_s": 2.5})
    gw = await start_gateway(settings)
    store = (await gw.manager()).store
    process_job = await store.insert_job(new_row("gone"), settings.lease.ttl_s)
    http_job = await store.insert_job(new_row("gone", transport="http"), settings.lease.ttl_s)
    await wait_for(lambda: _status(store, process_job.id, JobStatus.ORPHANED), 10)
    assert (await job_row(store, http_job.id)).status == JobStatus.QUEUED
    await wait_for(lambda: _status(store, http_job.id, JobStatus.ORPHANED), 10)


async def test_a_provably_alive_process_is_left_alone_but_a_reused_pid_is_not(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    settings = make_settings()
    gw = await start_gateway(settings)
    store = (await gw.manager()).store
    me = psutil.Process(os.getpid())
    here = {"hostname": proc.hostname(), "boot_id": proc.boot_id()}
    live = await store.insert_job(new_row("gone", **here), settings.lease.ttl_s)
    reused = await store.insert_job(new_row("gone", **here), settings.lease.ttl_s)
    for row, started in ((live, me.create_time()), (reused, me.create_time() - 1000)):
        assert await store.mark_running(row.id, "gone", settings.lease.ttl_s)
        assert await store.record_process(row.id, "gone", os.getpid(), os.getpgid(0), started)
    await wait_for(lambda: _status(store, reused.id, JobStatus.ORPHANED), 10)
    # Several more sweeps: the job whose process provably runs here is never orphaned.
    for _ in range(5):
        await leases_of(gw).sweep_once()
    assert (await job_row(store, live.id)).status == JobStatus.RUNNING


async def test_a_cross_instance_cancel_ends_the_run_on_the_owner(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings()
    owner = await (await start_gateway(settings)).manager()
    other = await (await start_gateway(settings)).manager()
    sub = await owner.submit("claude", SubmitRequest(prompt="cancel me @sleep=60"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    out = await other.cancel(sub.job.id)
    assert out.outcome == "cancel_requested"
    bound = settings.lease.cancel_poll_s + settings.limits.kill_grace_s + 5
    row = await wait_for(lambda: _terminal(other, sub.job.id), bound)
    assert row.status == JobStatus.CANCELLED
    pid = fake_log.spawns()[0]["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def _terminal(manager: JobManager, job_id: str) -> JobRow | None:
    row = await manager.reads.get(job_id)
    return row if row.status.is_terminal else None


async def test_a_stale_owner_that_revives_writes_the_real_result_over_orphaned(
    make_settings: MakeSettings, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    settings = make_settings()
    owner_gw = await start_gateway(settings)
    owner = await owner_gw.manager()
    judge = await start_gateway(settings)
    # The judge sits on another host: it cannot see the owner's process, only its lease.
    leases_of(judge).identity.hostname = "another-host"
    gate = tmp_path / "gate"  # the run ends once it is orphaned, however long that takes
    sub = await owner.submit("claude", SubmitRequest(prompt=f"outlive my lease @until={gate}"))
    await wait_for(lambda: _status(owner.store, sub.job.id, JobStatus.RUNNING))
    await leases_of(owner_gw).stop()  # the owner stops heartbeating (as if SIGSTOPped)
    await wait_for(lambda: _status(owner.store, sub.job.id, JobStatus.ORPHANED), 10)
    assert judge.leases is not None  # the other instance is the one that orphaned it
    # The run finishes on its revived owner, whose guarded write self-heals the row.
    gate.touch()
    await wait_for(lambda: _status(owner.store, sub.job.id, JobStatus.COMPLETED), 20)


async def test_heartbeat_failures_turn_admission_off_and_recovery_turns_it_back_on(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    settings = make_settings()
    gw = await start_gateway(settings)
    manager = await gw.manager()
    store = manager.store
    await store.close()  # the store goes away under a live instance
    await wait_for(lambda: not manager.admitting, 10)
    with pytest.raises(GatewayError) as err:
        await manager.submit("claude", SubmitRequest(prompt="refused", force_refresh=True))
    assert err.value.kind == ErrorKind.UNAVAILABLE and err.value.retryable
    await store.open()  # it comes back: the instance re-registers and admits again
    await wait_for(lambda: manager.admitting, 10)
    sub = await manager.submit("claude", SubmitRequest(prompt="accepted again"))
    assert (await manager.reads.wait(sub.job.id, 20)).status == JobStatus.COMPLETED


async def test_a_stopping_drain_fails_queued_and_stops_running_jobs_then_marks_the_instance_stopped(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # `on_shutdown = "stop"`, as before detach existed (this test also stands for
    # tests/jobs/test_detach.py's "stop as before", which it replaces: #24).
    settings = make_settings(lease={"on_shutdown": "stop"},
                             limits={"max_running_jobs": 1, "kill_grace_s": 5})
    gw = await start_gateway(settings)
    manager = await gw.manager()
    running = await manager.submit("claude", SubmitRequest(prompt="busy @ignore-term @sleep=60"))
    queued = await manager.submit("claude", SubmitRequest(prompt="queued"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    (spawn,) = fake_log.spawns()  # the queued job never starts
    t0 = time.monotonic()
    await gw.stop()
    assert time.monotonic() - t0 < settings.lease.drain_timeout_s  # SIGKILL after 0.2 s
    assert not proc.group_alive(spawn["pgid"]), "the drain left the provider's group behind"
    with contextlib.suppress(psutil.NoSuchProcess):  # gone, or at most a zombie
        assert psutil.Process(spawn["pid"]).status() == psutil.STATUS_ZOMBIE
    reader = await (await start_gateway(settings)).manager()
    for sub in (running, queued):
        row = await reader.reads.get(sub.job.id)
        assert (row.status, row.error_kind) == (JobStatus.FAILED, ErrorKind.SHUTDOWN)
    instances = {i.instance_id: i for i in await reader.store.list_instances()}
    assert instances[gw.instance_id].stopped_at is not None
    assert len(fake_log.spawns()) == 1


async def test_a_late_heartbeat_skips_the_next_sweep(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(make_settings())
    t0 = time.monotonic()
    await wait_for(lambda: (leases_of(gw).last_heartbeat_ok or 0) > t0)  # the loops are running
    with structlog.testing.capture_logs() as logs:
        time.sleep(0.7)  # the event loop stalls for over three heartbeat intervals
        await wait_for(lambda: any(e.get("action") == "heartbeat_drift" for e in logs), 5)
        await wait_for(lambda: any(e["event"].startswith("sweep skipped") for e in logs), 5)


# -- a wall-clock step (issue 15, item 8) ---------------------------------------------------


class SteppingClock:
    """The store's wall clock, which a test can step forward the way a suspend and resume
    does: the monotonic clock (the loops' sleeps) does not see the step."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_wall_clock_step_never_orphans_live_peers_queued_jobs(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    """Regression: after a suspend and resume, two live heartbeating instances on one
    SQLite file orphaned each other's queued jobs (never launched): every lease looked
    lapsed at once, and the monotonic drift check does not see a suspend."""
    settings = make_settings(limits={"max_running_jobs": 1, "kill_grace_s": 1.0})
    gateways = [await start_gateway(settings) for _ in range(2)]
    clock = SteppingClock()
    for gw in gateways:
        store_of(gw).clock = clock  # type: ignore[attr-defined]  # both share the one host clock
    jobs = []
    for n, gw in enumerate(gateways):
        manager = await gw.manager()
        jobs.append(await manager.submit("claude", SubmitRequest(prompt=f"busy {n} @sleep=30")))
        for q in range(3):
            jobs.append(await manager.submit("claude", SubmitRequest(prompt=f"queued {n} {q}")))
    await wait_for(lambda: len(fake_log.spawns()) == 2)
    store = store_of(gateways[0])
    a, b = (leases_of(gw) for gw in gateways)
    # The host suspends: every loop freezes. B renewed last half a ttl before A did.
    for keeper in (a, b):
        await keeper.stop()
    await b.heartbeat_once()
    await anyio.sleep(settings.lease.ttl_s / 2)
    await a.heartbeat_once()
    with structlog.testing.capture_logs() as logs:
        # It resumes with the wall clock stepped ahead: A's own lease is still within its
        # ttl, B's has lapsed, and B has not run yet. A's reaper fires first.
        clock.offset += 0.6 * settings.lease.ttl_s
        assert await a.sweep_once() == []
        assert any(e.get("action") == "clock_step" for e in logs)
        for keeper in (b, a):
            await keeper.start()  # the loops run again: B renews at once
        # Quiet for a ttl, then sweeps judge again with everybody's lease renewed.
        resumed = max(keeper._judge_after for keeper in (a, b))
        await wait_for(lambda: time.monotonic() > resumed + 5 * settings.lease.sweep_interval_s,
                       3 * settings.lease.ttl_s + 5)
    for sub in jobs:
        row = await job_row(store, sub.job.id)
        assert row.status.is_active, (row.status, row.error)


async def test_an_instance_whose_own_lease_lapsed_on_the_store_clock_judges_nobody(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    """An instance that stopped renewing (its heartbeat loop is stuck) while its reaper
    runs judges no other instance until its own lease is renewed again."""
    settings = make_settings()
    gw = await start_gateway(settings)
    store = (await gw.manager()).store
    (heartbeat,) = [t for t in leases_of(gw)._tasks if t.get_name() == "heartbeat"]
    heartbeat.cancel()
    await asyncio.gather(heartbeat, return_exceptions=True)

    async def own_lease_lapsed() -> bool:
        (mine,) = [i for i in await store.list_instances() if i.instance_id == gw.instance_id]
        expires = mine.lease_expires_at
        return expires is not None and await store.now() > expires.timestamp()

    # A renewal cancelled in flight may still commit (PostgreSQL at load 10): then the dead
    # job's lease lapsed while ours was fresh, and the sweep rightly judged it. So the dead
    # job comes once our lease has lapsed as the store has it.
    await wait_for(own_lease_lapsed)
    row = await store.insert_job(new_row("dead-instance"), settings.lease.ttl_s)
    inserted_at = await store.now()
    # Well past the dead owner's lease: sweeps judge nobody.
    while await store.now() < inserted_at + 3 * settings.lease.ttl_s:
        assert await leases_of(gw).sweep_once() == []
        await anyio.sleep(settings.lease.sweep_interval_s)
    assert (await job_row(store, row.id)).status == JobStatus.QUEUED

    async def renewed_then_judged() -> bool:
        # Renewed again: it judges, and the dead job goes, by this sweep or by the keeper's
        # own sweep loop, which runs on. (A loaded box may take over the 1 s ttl between the
        # renewal and the sweep: then it judges nobody, and renews again.)
        await leases_of(gw).heartbeat_once()
        judged = [r.id for r in await leases_of(gw).sweep_once()]
        assert judged in ([], [row.id]), judged
        return (await job_row(store, row.id)).status is JobStatus.ORPHANED

    await wait_for(renewed_then_judged)


# -- the SQLite file deleted while running (issue 15, item 9) -------------------------------


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_deleted_sqlite_file_stops_admission_and_no_write_vanishes_into_it(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
) -> None:
    """Regression: with its file deleted the gateway went on writing into the unlinked
    inode (results vanished at stop), and a second gateway created an empty file, so an
    identical request ran twice. The first gateway notices on its next heartbeat, stops
    admitting, says why, and writes nothing more to the dead file."""
    settings = make_settings()
    gw = await start_gateway(settings)
    manager = await gw.manager()
    gate = tmp_path / "gate"  # the run ends after its file is gone, however slow the box
    running = await manager.submit("claude", SubmitRequest(prompt=f"mine @until={gate}"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    db = settings.persistence.path
    with structlog.testing.capture_logs() as logs:
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            path.unlink(missing_ok=True)
        await wait_for(lambda: manager.store_problem is not None, 10)
        assert not manager.admitting
        assert any(e.get("action") == "store_replaced" for e in logs)
        assert manager.store_problem is not None
        assert "deleted" in manager.store_problem and str(db) in manager.store_problem
        with pytest.raises(GatewayError) as refused:
            await manager.submit("claude", SubmitRequest(prompt="mine @sleep=1"))
        assert refused.value.kind == ErrorKind.UNAVAILABLE
        assert "deleted" in refused.value.message
        gate.touch()
        # The run ends, but its result is not written into the unlinked file: the terminal
        # write is refused (and retried: a restored file would take it), the spool stays.
        await wait_for(lambda: any(e.get("action") == "complete" and "deleted" in e.get("error", "")
                                   for e in logs), 20)
    assert (manager.spool_root / running.job.id / "0" / "stdout").exists()
    # A second gateway on the same path starts on a new, empty file (nothing to see).
    other = await (await start_gateway(settings)).manager()
    assert await other.store.get_job(running.job.id) is None


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_stopping_the_loops_is_bounded_when_one_ignores_its_cancel(
    make_settings: MakeSettings, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop that does not end when cancelled cannot keep a gateway from leaving: it is
    logged, with where it waits, and the stop goes on."""
    from gateway.jobs import leases as leases_module

    monkeypatch.setattr(leases_module, "STOP_LOOPS_S", 0.2)
    keeper = leases_of(await start_gateway(make_settings()))
    release = asyncio.Event()

    started = asyncio.Event()

    async def deaf() -> None:  # a tick stuck in a call that ignores the cancel
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    stuck = asyncio.create_task(deaf(), name="deaf")
    await wait_for(lambda: started.is_set())  # a cancel before its first step would end it
    keeper._tasks.append(stuck)
    try:
        with structlog.testing.capture_logs() as logs, anyio.fail_after(scaled(10)):
            await keeper.stop()
        (line,) = [e for e in logs if e["event"].startswith("lease loop did not stop")]
        assert line["loop"] == "deaf" and "deaf" in line["waiting_in"]
    finally:
        release.set()
        await stuck


def gone(path: Path) -> bool:
    return not path.exists()


async def test_a_sweep_removes_the_spool_an_ended_jobs_killed_writer_left_and_nothing_else(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    # The portable chaos run: a gateway SIGSTOPped 3 ms after its terminal write, then
    # SIGKILLed, left its job's attempt dir half removed, and nobody removed it.
    settings = make_settings()
    gw = await start_gateway(settings)
    manager = await gw.manager()
    # Two ended jobs: one whose dir a killed writer left idle, one whose dir was changed just
    # now (two, since the gateway's own reaper loop may still be removing the first's path
    # when the test makes the second's: a CI run saw its mkdir lose the parent it had made).
    ended, ended_now = [await manager.submit("claude", SubmitRequest(prompt=f"done {n} @sleep=0"))
                        for n in range(2)]
    root = manager.spool_root
    for job_dir in (root / ended.job.id, root / ended_now.job.id):
        assert (await manager.reads.wait(job_dir.name, 20)).status == JobStatus.COMPLETED
        # Its own gateway removes its spool shortly after the answer (settled_spools.py): the
        # dirs made below stand for one a killed writer left, so that removal must be over.
        await wait_for(functools.partial(gone, job_dir), 20)
    running = await manager.submit("claude", SubmitRequest(prompt="still going @sleep=30"))
    await wait_for(lambda: _status(manager.store, running.job.id, JobStatus.RUNNING), 20)
    idle = time.time() - 60

    def left_behind(job_id: str, *, idle_since: float = idle) -> Any:
        attempt = root / job_id / "0"
        attempt.mkdir(parents=True, exist_ok=True)
        for path in (attempt, attempt.parent):
            os.utime(path, (idle_since, idle_since))
        return attempt.parent

    stale = left_behind(ended.job.id)
    unknown = left_behind(str(uuid.uuid4()))  # no row: retention's, or another store's
    # Its lease outlasts the test however slow the box: never orphaned (and settled) here.
    peer = await manager.store.insert_job(new_row("a-peer"), 3600)
    peers = left_behind(peer.id)  # an active job of another gateway's
    live = root / running.job.id  # a local run's own spool, however idle
    os.utime(live, (idle, idle))
    await leases_of(gw).sweep_once()
    assert not stale.exists()
    assert unknown.exists() and live.exists() and peers.exists()
    # Changed just now (its writer may be removing it): dated ahead, so it stays recent
    # however long the sweep takes to look on a loaded box (SETTLED_SPOOL_IDLE_S is 2 s; a
    # PostgreSQL sweep in CI once took longer and removed it).
    fresh = left_behind(ended_now.job.id, idle_since=time.time() + 3600)
    await leases_of(gw).sweep_once()
    assert fresh.exists()
    await manager.cancel(running.job.id)
