"""Jobs outlive their gateway: detach on shutdown, adoption by the next gateway, re-queue of
unstarted work (docs/architecture.md, Shutdown). Real gateways on a real store (SQLite file and
PostgreSQL), real supervisors and fake CLIs; an owner that must be SIGKILLed runs in a
process of its own (tests/jobs/owner_gateway.py).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from gateway import proc
from gateway.config import Settings
from gateway.jobs import adoption, leases
from gateway.jobs.manager import JobManager, Submission
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.spool import run_dir, spool_root
from gateway.model import Completion, ErrorKind, InstanceRow, JobRow, JobStatus, NewJob
from gateway.store import open_store
from gateway.store.base import TakeOver
from tests.children import Children
from tests.conftest import in_ci
from tests.jobs.conftest import (
    FakeLog,
    MakeSettings,
    StartGateway,
    here,
    job_row,
    leases_of,
    store_of,
)
from tests.jobs.owner_gateway import NO_FINALIZER_ENV
from tests.waiting import scaled, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

REPO = Path(__file__).resolve().parents[2]
DONE_S = 20.0  # a bound on any job of these tests reaching its end
# A lease no test outlives: an instance row the test holds alive until it says stopped.
ADOPTER_LEASE_S = 3600.0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def terminal(manager: Any, job_id: str) -> Any:
    row = await manager.reads.get(job_id)
    return row if row.status.is_terminal else None


def spool_of(settings: Settings, job_id: str) -> Path:
    """The spool dir of a job's first launch (spool.run_dir)."""
    return settings.state_dir / "spool" / job_id / "0"


def claude_job(n: int, prompt: str, owner: str) -> NewJob:
    """A claude job of this host, as `owner` would have admitted it (a ghost: no row)."""
    request: dict[str, Any] = {"provider": "claude", "prompt": prompt, "model": None, "working_dir": None,
               "session_id": None, "options": {}}
    return NewJob(id=f"00000000-0000-4000-8000-{n:012d}", provider="claude",
                  request_key=f"k-{n}", owner_instance=owner,
                  request_json=json.dumps(request), **here())


async def detached_job(make_settings: Any, start_gateway: Any, fake_log: FakeLog,
                       prompt: str, **submit: Any) -> tuple[Settings, str]:
    """A job that was running when its gateway shut down (detach, the default)."""
    settings = make_settings()
    assert settings.lease.on_shutdown == "detach"
    gw = await start_gateway(settings)
    manager = await gw.manager()
    spawned = len(fake_log.spawns())
    sub = await manager.submit("claude", SubmitRequest(prompt=prompt, **submit))
    await wait_for(lambda: len(fake_log.spawns()) > spawned)
    await gw.stop()
    # Detached: the instance row says stopped (from then a gateway on this host may adopt).
    # How fast, bench/ measures (against Claude Code's 600 ms from SIGINT to SIGKILL): a
    # clock in a test fails on a loaded box.
    store = await open_store(settings)
    try:
        mine = [i for i in await store.list_instances() if i.instance_id == gw.instance_id]
    finally:
        await store.close()
    assert len(mine) == 1 and mine[0].stopped_at is not None, mine
    return settings, sub.job.id


async def test_a_detached_run_goes_on_and_the_next_gateway_finalizes_its_answer(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    # The run is held (@until=) until the next gateway has seen it running: a 1.5 s sleep
    # ended first at load 18.
    go = tmp_path / "go"
    prompt = f"survive the window @until={go}"
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log, prompt)
    pid = fake_log.spawns()[-1]["pid"]
    assert alive(pid)  # nothing was killed
    reader = await start_gateway(make_settings())
    row = await store_of(reader).get_job(job_id)
    assert row is not None and row.status is JobStatus.RUNNING
    # Its lease covers the supervisor's worst case: no other host may orphan it meanwhile.
    assert row.lease_deadline is not None
    assert row.lease_deadline.timestamp() > time.time() + settings.limits.default_timeout_s
    stopped = {i.instance_id: i.stopped_at for i in await store_of(reader).list_instances()}
    assert all(stopped[i] is not None for i in stopped if i != reader.instance_id)
    manager = await reader.manager()
    go.touch()
    done = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert done.status is JobStatus.COMPLETED and done.exit_code == 0
    page = await manager.reads.read_result(job_id)
    assert page.output == f"fake-claude answer: {prompt}"
    assert page.parsed is not None and page.parsed["session_id"]
    assert len(fake_log.spawns()) == 1
    await wait_for(lambda: not spool_of(settings, job_id).exists())  # the row holds it now


async def test_a_run_that_ended_with_no_gateway_alive_is_finalized_at_start(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log,
                                          "finish alone @sleep=0.3 @exit=3")
    spool = spool_of(settings, job_id)
    await wait_for(lambda: sup.read_record(spool, sup.END_NAME), DONE_S)
    gw = await start_gateway(make_settings())
    # Settled during start (before any tool call could be served): no sweep needed.
    manager = await gw.manager()
    with anyio.fail_after(scaled(5)):
        row = await manager.reads.wait(job_id, 5)
    assert row.status is JobStatus.FAILED
    assert (row.exit_code, row.error_kind) == (3, ErrorKind.PROVIDER_ERROR)  # its real code
    assert "finish alone" in (await manager.reads.read_result(job_id)).output


async def test_the_timeout_holds_while_no_gateway_is_alive(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # The CLI must start (and log it) inside its timeout: a fixed 3 s ran out first at load 20.
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log,
                                          "too slow @sleep=600 @ignore-term",
                                          timeout_s=round(scaled(3.0), 1))
    pid = fake_log.spawns()[-1]["pid"]
    record = await wait_for(lambda: sup.read_record(spool_of(settings, job_id), sup.END_NAME),
                            DONE_S)
    assert record["why"] == sup.WHY_TIMEOUT and not alive(pid)
    manager = await (await start_gateway(make_settings())).manager()
    row = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert (row.status, row.exit_code, row.error_kind) == (
        JobStatus.TIMED_OUT, 124, ErrorKind.TIMEOUT)


async def test_a_duplicate_request_joins_a_detached_job(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    go = tmp_path / "go"  # held until the duplicate has joined it (see above)
    _, job_id = await detached_job(make_settings, start_gateway, fake_log, f"once @until={go}")
    manager = await (await start_gateway(make_settings())).manager()
    again = await manager.submit("claude", SubmitRequest(prompt=f"once @until={go}"))
    assert again.deduplicated and again.job.id == job_id
    go.touch()
    row = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert row.status is JobStatus.COMPLETED and len(fake_log.spawns()) == 1


async def test_three_gateways_starting_together_adopt_once_and_run_once(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    go = tmp_path / "go"  # held until all three have started (see above)
    prompt = f"one answer @until={go}"
    _, job_id = await detached_job(make_settings, start_gateway, fake_log, prompt)
    gateways: list[Any] = []

    async def start() -> None:
        gateways.append(await start_gateway(make_settings()))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(start)
    managers = [await gw.manager() for gw in gateways]
    go.touch()
    row = await wait_for(lambda: terminal(managers[0], job_id), DONE_S)
    assert row.status is JobStatus.COMPLETED
    assert row.owner_instance in {gw.instance_id for gw in gateways}
    assert len(fake_log.spawns()) == 1
    page = await managers[1].reads.read_result(job_id)
    assert page.output == f"fake-claude answer: {prompt}"


async def test_queued_work_released_at_detach_is_requeued_once_and_runs_once(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    settings = make_settings(limits={"max_running_jobs": 1, "kill_grace_s": 1.0})
    gw = await start_gateway(settings)
    manager = await gw.manager()
    # The first run is held (@until=) until the gateway is gone, so the second is surely
    # still queued at the detach however slowly a loaded box polls (a 1 s sleep raced it).
    go = tmp_path / "go"
    first = await manager.submit("claude", SubmitRequest(prompt=f"first @until={go}"))
    second = await manager.submit("claude", SubmitRequest(prompt="second"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    await gw.stop()
    next_manager = await (await start_gateway(settings)).manager()
    go.touch()
    for sub in (first, second):
        row = await wait_for(functools.partial(terminal, next_manager, sub.job.id), DONE_S)
        assert row.status is JobStatus.COMPLETED
    requeued = await job_row(next_manager.store, second.job.id)
    assert requeued.requeued_at is not None  # the row shows it was retried
    assert (await job_row(next_manager.store, first.job.id)).requeued_at is None
    assert sorted(fake_log.prompts()) == [f"first @until={go}", "second"]


async def test_a_requeued_job_keeps_the_callers_timeout(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    settings = make_settings(limits={"max_running_jobs": 1, "kill_grace_s": 0.5})
    gw = await start_gateway(settings)
    manager = await gw.manager()
    go = tmp_path / "go"  # the first run is held until its gateway is gone (see above)
    await manager.submit("claude", SubmitRequest(prompt=f"first @until={go}"))
    slow = await manager.submit("claude", SubmitRequest(prompt="slow @sleep=600", timeout_s=2))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    await gw.stop()
    next_manager = await (await start_gateway(settings)).manager()
    go.touch()
    row = await wait_for(lambda: terminal(next_manager, slow.job.id), DONE_S)
    assert row.requeued_at is not None
    assert (row.status, row.error_kind) == (JobStatus.TIMED_OUT, ErrorKind.TIMEOUT)
    assert "2 s" in (row.error or "")


async def test_a_run_marked_running_whose_owner_died_before_its_supervisor_is_run_once(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # The owner marked the row running and made its spool dir, then died before the
    # supervisor claimed the run. The adopter claims it in the spool and re-queues it.
    settings = make_settings()
    gw = await start_gateway(settings)
    adopter = await gw.manager()
    store = adopter.store
    job = claude_job(1, "never started", "ghost")
    await store.insert_job(job, settings.lease.ttl_s)
    assert await store.mark_running(job.id, "ghost", settings.lease.ttl_s)
    spool_of(settings, job.id).mkdir(parents=True)
    row = await wait_for(lambda: terminal(adopter, job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.requeued_at is not None
    assert fake_log.prompts() == ["never started"]


async def test_a_run_left_unstarted_twice_is_queued_again_and_runs_once(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Found by the detach chaos run: re-queued once, marked running by its second owner,
    # which detached (lease extended to timeout_s) before its supervisor started. It used
    # to stay `running` for an hour, then to end failed ("re-queued once"). Nothing ran, so
    # the adopter claims the spool (no late supervisor can start it) and queues it again.
    settings = make_settings()
    adopter = await (await start_gateway(settings)).manager()
    store = adopter.store
    job = claude_job(2, "never started twice", "ghost")
    await store.insert_job(job, settings.lease.ttl_s)
    requeued = await store.requeue_job(TakeOver(
        job_id=job.id, expected_owner="ghost", expected_status=JobStatus.QUEUED,
        instance_id="ghost-2", ttl_s=settings.lease.ttl_s, **here()))
    assert requeued is not None
    assert await store.mark_running(job.id, "ghost-2", settings.lease.ttl_s)
    await store.extend_leases("ghost-2", {job.id: 3600.0})
    run_dir(spool_root(settings.state_dir), requeued).mkdir(parents=True)  # its second attempt
    with anyio.fail_after(scaled(DONE_S)):
        row = await wait_for(lambda: terminal(adopter, job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == adopter.instance_id
    assert row.requeued_at is not None
    assert fake_log.prompts() == ["never started twice"]


async def test_a_runs_spool_dir_exists_before_its_row_says_running(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # What the test above relies on: an owner SIGKILLed right after its job's row said
    # running left a spool dir, so the adopter can claim and re-queue the run. Without it the
    # adopter cannot prove the run never started and the job ends orphaned (the chaos run
    # found that window). The real store's writes, observed at the moment they are called:
    # the insert of a job admitted into a free run slot (inserted running) and of one that
    # waits for a slot (queued, no dir yet), then that one's queued -> running CAS.
    settings = make_settings(limits={"max_running_jobs": 1, "max_running_per_provider": 1})
    manager = await (await start_gateway(settings)).manager()
    seen: list[tuple[str, bool]] = []
    insert, cas = manager.store.insert_job, manager.store.mark_running

    async def observed_insert(job: NewJob, *args: Any, **kwargs: Any) -> JobRow:
        seen.append((f"insert {'running' if job.running else 'queued'}",
                     spool_of(settings, job.id).is_dir()))
        return await insert(job, *args, **kwargs)

    async def observed_cas(job_id: str, *args: Any, **kwargs: Any) -> bool:
        seen.append(("cas", spool_of(settings, job_id).is_dir()))
        return await cas(job_id, *args, **kwargs)

    manager.store.insert_job = observed_insert  # type: ignore[method-assign]
    manager.store.mark_running = observed_cas  # type: ignore[method-assign]
    first = await manager.submit("claude", SubmitRequest(prompt="spool first @sleep=0.5"))
    second = await manager.submit("claude", SubmitRequest(prompt="spool first, queued"))
    for job_id in (first.job.id, second.job.id):
        row = await wait_for(functools.partial(terminal, manager, job_id), DONE_S)
        assert row.status is JobStatus.COMPLETED
    assert seen == [("insert running", True), ("insert queued", False), ("cas", True)]


async def queued_under_a_stalled_owner(settings: Settings, job: NewJob,
                                       cancel: bool = False) -> None:
    """`job`, queued by an owner proven alive on this host (this process's pid and start
    time) that then stalled past its lease (SIGSTOPped: no heartbeat). With `cancel`, a
    cancel was requested before the owner's poller saw it."""
    store = await open_store(settings)
    try:
        await store.register_instance(this_process_as(job.owner_instance), 0.05)
        await store.insert_job(job, 0.05)
        if cancel:
            assert await store.request_cancel(job.id) is not None
        await leases_lapsed(settings, store, [job])
    finally:
        await store.close()


def this_process_as(instance_id: str | None) -> InstanceRow:
    """An instance row for this test process: an owner proven alive on this host."""
    assert instance_id is not None
    return InstanceRow(instance_id=instance_id, pid=os.getpid(),
                       pid_started_at=proc.process_start_time(os.getpid()), role="stdio",
                       version="test", **here())


async def leases_lapsed(settings: Settings, store: Any, jobs: list[NewJob]) -> None:
    """Wait until the reaper would list every one of `jobs` (its lease and its owner's
    lapsed)."""

    async def lapsed() -> bool:
        expired = await store.list_expired_candidates(settings.lease.http_job_grace_s)
        return {job.id for job in jobs} <= {r.id for r in expired}

    await wait_for(lapsed)


async def never_orphaned_for(manager: Any, job_id: str, sweeps: int, gw: Any) -> None:
    """Sweep `sweeps` times: the job is never orphaned (or ended) meanwhile."""
    for _ in range(sweeps):
        await gw.leases.sweep_once()
        assert (await manager.reads.get(job_id)).status is JobStatus.QUEUED


def grace_passes_mid_sweep(gw: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The stalled-owner grace drops to 0.2 s between a sweep's adoption and its reaper, the
    worst moment (a loaded box once lined a background sweep up with it): the reaper must
    judge by the grace adoption judged by, never orphan what adoption left queued."""
    keeper = leases_of(gw)
    adopt = keeper.adopter.sweep
    shortened: list[bool] = []

    async def adopt_then_shorten() -> int:
        taken = await adopt()
        if not shortened:
            keeper.stalled_owner_grace_s = 0.2
            shortened.append(True)
        return taken

    monkeypatch.setattr(keeper.adopter, "sweep", adopt_then_shorten)
    return shortened


async def test_a_queued_job_of_a_stalled_owner_is_never_orphaned_and_requeued_after_the_grace(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by the detach chaos run: an owner SIGSTOPped past its lease had its queued job
    # orphaned, then re-queued and completed: a terminal state that changed (a poller that
    # saw `orphaned` had stopped polling). Now it stays queued with its live owner until the
    # grace passes, then a peer re-queues it directly.
    settings = make_settings()
    job = claude_job(3, "queued under a stalled owner", "stalled")
    await queued_under_a_stalled_owner(settings, job)
    gw = await start_gateway(settings)
    manager = await gw.manager()
    await never_orphaned_for(manager, job.id, 5, gw)
    assert fake_log.prompts() == []
    shortened = grace_passes_mid_sweep(gw, monkeypatch)
    await wait_for(lambda: shortened)
    row = await wait_for(lambda: terminal(manager, job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.requeued_at is not None
    assert row.owner_instance == manager.instance_id
    assert fake_log.prompts() == ["queued under a stalled owner"]


async def test_a_cancelled_queued_job_of_a_stalled_owner_ends_cancelled_never_orphaned(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by the detach chaos run: cancelled while queued, then orphaned before the
    # stopped owner's poller saw the cancel. It must end cancelled, never via `orphaned`.
    settings = make_settings()
    job = claude_job(4, "cancelled under a stalled owner", "stalled")
    await queued_under_a_stalled_owner(settings, job, cancel=True)
    gw = await start_gateway(settings)
    manager = await gw.manager()
    await never_orphaned_for(manager, job.id, 3, gw)
    shortened = grace_passes_mid_sweep(gw, monkeypatch)
    await wait_for(lambda: shortened)
    row = await wait_for(lambda: terminal(manager, job.id), DONE_S)
    assert row.status is JobStatus.CANCELLED
    assert row.error_kind == ErrorKind.CANCELLED and row.requeued_at is None
    assert fake_log.prompts() == []


async def lapsed_ghosts(settings: Settings, dead: list[NewJob], busy: list[NewJob]) -> None:
    """`busy`, queued by a live owner ("busy": this process), then `dead`, queued by an
    owner with no instance row (gone), their leases lapsed."""
    store = await open_store(settings)
    try:
        await store.register_instance(this_process_as("busy"), ADOPTER_LEASE_S)
        for job in busy:
            await store.insert_job(job, ADOPTER_LEASE_S)
        for job in dead:
            await store.insert_job(job, 0.05)
        await leases_lapsed(settings, store, dead)
    finally:
        await store.close()


async def requeued_and_run(gw: Any, dead: list[NewJob], fake_log: FakeLog) -> None:
    manager = await gw.manager()
    for job in dead:
        row = await wait_for(functools.partial(terminal, manager, job.id), DONE_S)
        assert row.status is JobStatus.COMPLETED and row.requeued_at is not None, row
    assert sorted(fake_log.prompts()) == sorted(json.loads(j.request_json)["prompt"]
                                                for j in dead)


async def test_a_gone_owner_s_job_behind_a_full_adoption_batch_is_requeued_never_orphaned(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A busy host: more active jobs of live gateways (another window's burst) than adoption
    # reads a sweep, all older than a dead owner's queued job. Adoption must still reach
    # that job (a lapsed owner's jobs are read first), never leave it to the reaper.
    settings = make_settings()
    busy = [claude_job(n, f"busy {n}", "busy") for n in (20, 21)]
    dead = [claude_job(22, "queued by a dead owner", "dead")]
    await lapsed_ghosts(settings, dead, busy)
    monkeypatch.setattr(adoption, "ADOPT_BATCH", 2)  # the two busy jobs would fill it
    monkeypatch.setattr(leases, "STALLED_OWNER_GRACE_S", 0.0)  # the reaper's fallback: due
    gw = await start_gateway(settings)
    await requeued_and_run(gw, dead, fake_log)
    manager = await gw.manager()
    for job in busy:  # a live owner's jobs stay its own
        row = await manager.reads.get(job.id)
        assert row.status is JobStatus.QUEUED and row.owner_instance == "busy"


async def test_the_reaper_never_orphans_a_job_a_cut_short_adoption_did_not_look_at(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # More dead owners' jobs than one sweep's batch: the first is re-queued, the second
    # waits for the next sweep's adoption; the same sweep's reaper must not orphan it.
    settings = make_settings(lease={"sweep_interval_s": 3600.0})  # the test sweeps
    monkeypatch.setattr(leases, "STALLED_OWNER_GRACE_S", 0.0)  # the reaper's fallback: due
    gw = await start_gateway(settings)
    dead = [claude_job(n, f"dead owner's {n}", f"dead-{n}") for n in (23, 24)]
    await lapsed_ghosts(settings, dead, [])
    monkeypatch.setattr(adoption, "ADOPT_BATCH", 1)
    assert await leases_of(gw).sweep_once() == []  # one re-queued, the other left unseen
    assert await leases_of(gw).sweep_once() == []  # the other re-queued
    await requeued_and_run(gw, dead, fake_log)


async def test_an_owner_that_lost_its_job_leaves_the_spool_to_the_job_s_new_owner(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Found by the detach chaos run ("the supervisor ended without recording how the run
    # ended"): an owner stopped past its lease had its running job adopted, woke, saw the
    # run end first and, its terminal write refused, deleted the spool: the adopter then
    # read no end record. The spool is the new owner's evidence.
    # The adopter is alive (this process, on this host and boot) until the checks are done:
    # with no row it would be gone at once, and this gateway's sweep could adopt the job
    # back and finalize it (spool removed), or the reaper orphan it when the 1 s lease of
    # the adoption lapsed with the 1 s run, before the checks below ran (a loaded CI box).
    settings = make_settings()
    gw = await start_gateway(settings)
    manager = await gw.manager()
    adopter = this_process_as("adopter")
    await manager.store.register_instance(adopter, ADOPTER_LEASE_S)
    sub = await manager.submit("claude", SubmitRequest(prompt="taken from me @sleep=1"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    taken = await manager.store.adopt_job(TakeOver(
        job_id=sub.job.id, expected_owner=manager.instance_id,
        expected_status=JobStatus.RUNNING, instance_id=adopter.instance_id,
        ttl_s=settings.lease.ttl_s, **here()))
    assert taken is not None
    await wait_for(lambda: sub.job.id not in manager.local_job_ids(), DONE_S)
    spool = spool_of(settings, sub.job.id)
    assert sup.read_record(spool, sup.END_NAME) is not None  # kept, not deleted
    row = await job_row(manager.store, sub.job.id)
    assert (row.status, row.owner_instance) == (JobStatus.RUNNING, adopter.instance_id)
    # Its new owner stops too (gone): the next sweep finalizes it from the spool.
    await manager.store.mark_instance_stopped(adopter.instance_id)
    row = await wait_for(lambda: terminal(manager, sub.job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == manager.instance_id
    page = await manager.reads.read_result(sub.job.id)
    assert page.output == "fake-claude answer: taken from me @sleep=1"
    assert len(fake_log.spawns()) == 1


TRANSITIONS = ["inserted running", "queued, then marked running"]


async def submit_through(manager: JobManager, transition: str, prompt: str,
                         then: Callable[[str], Awaitable[None]]) -> Submission:
    """Submit `prompt`; `then(job_id)` runs once, right after its row says running and
    before its launch (the owner stopped there): `transition` is the insert of a job that
    found a free run slot, or the launch's CAS of one that waited in the queue (the one slot
    held by a stand-in until it is queued)."""
    store = manager.store
    insert, cas = store.insert_job, store.mark_running
    done: list[str] = []

    async def once(job_id: str) -> None:
        if not done:
            done.append(job_id)
            await then(job_id)

    async def inserted(job: NewJob, *args: Any, **kwargs: Any) -> JobRow:
        row = await insert(job, *args, **kwargs)
        if row.status is JobStatus.RUNNING:
            await once(job.id)
        return row

    async def marked(job_id: str, *args: Any, **kwargs: Any) -> bool:
        result = await cas(job_id, *args, **kwargs)
        await once(job_id)
        return result

    if transition == "inserted running":
        store.insert_job = inserted  # type: ignore[method-assign]  # observe the insert
        return await manager.submit("claude", SubmitRequest(prompt=prompt))
    store.mark_running = marked  # type: ignore[method-assign]  # observe the CAS
    held = manager.limiter.acquire("claude")  # the one run slot's stand-in
    try:
        sub = await manager.submit("claude", SubmitRequest(prompt=prompt))
        assert sub.job.status is JobStatus.QUEUED
    finally:
        held.release()
    return sub


@pytest.mark.parametrize("transition", TRANSITIONS)
async def test_a_supervisor_that_lost_the_claim_to_a_requeue_leaves_the_job_to_it(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    transition: str,
) -> None:
    # Found by the detach chaos run ("the supervisor ended without recording how the run
    # ended"): a peer judged the owner gone and claimed the spool for a re-queue just
    # before the owner's supervisor could; the owner ended the job launch_failed before
    # the peer's re-queue CAS came. The run never started: the job is the claimer's.
    settings = make_settings(limits={"max_running_jobs": 1, "max_running_per_provider": 1})
    manager = await (await start_gateway(settings)).manager()

    async def claimed_by_a_peer(job_id: str) -> None:
        assert sup.claim_for_requeue(spool_of(settings, job_id), by="peer")

    sub = await submit_through(manager, transition, "claimed by a peer", claimed_by_a_peer)
    await wait_for(lambda: sub.job.id not in manager.local_job_ids(), DONE_S)
    row = await job_row(manager.store, sub.job.id)
    assert row.status is JobStatus.RUNNING  # nothing written: not launch_failed
    assert fake_log.spawns() == []
    # The peer's re-queue lands, and the peer dies: this gateway re-queues and runs it.
    assert await manager.store.requeue_job(TakeOver(
        job_id=row.id, expected_owner=manager.instance_id, expected_status=JobStatus.RUNNING,
        instance_id="peer", ttl_s=settings.lease.ttl_s, **here())) is not None
    row = await wait_for(lambda: terminal(manager, sub.job.id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == manager.instance_id
    assert fake_log.prompts() == ["claimed by a peer"]


@pytest.mark.parametrize("transition", TRANSITIONS)
async def test_an_owner_that_wakes_after_its_job_was_requeued_and_run_never_launches_it(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    transition: str,
) -> None:
    # Found by the stop chaos run on PostgreSQL (duplicate_runs=1): an owner SIGSTOPped
    # between its queued -> running CAS and its launch; a peer claimed the spool, re-queued
    # the job, ran it and removed the spool; the owner woke, made the spool dir again and
    # its supervisor claimed a run that had already happened. A launch now only uses the
    # dir made before its row said running, one per attempt (spool.run_dir), and never
    # recreates it. The same holds for a job inserted running.
    settings = make_settings(limits={"max_running_jobs": 1, "max_running_per_provider": 1})
    manager = await (await start_gateway(settings)).manager()
    store = manager.store
    cas = store.mark_running

    async def peer_ran_it_meanwhile(job_id: str) -> None:
        # Meanwhile the peer: it claims the run, re-queues it, runs it, cleans up.
        assert sup.claim_for_requeue(spool_of(settings, job_id), by="peer")
        row = await store.requeue_job(TakeOver(
            job_id=job_id, expected_owner=manager.instance_id,
            expected_status=JobStatus.RUNNING, instance_id="peer", ttl_s=settings.lease.ttl_s,
            **here()))
        assert row is not None
        shutil.rmtree(settings.state_dir / "spool" / job_id)
        assert await cas(job_id, "peer", settings.lease.ttl_s)
        assert await store.complete(job_id, "peer", Completion(
            status=JobStatus.COMPLETED, exit_code=0, output="the peer's answer"))

    sub = await submit_through(manager, transition, "run by the peer", peer_ran_it_meanwhile)
    await wait_for(lambda: sub.job.id not in manager.local_job_ids(), DONE_S)
    row = await job_row(store, sub.job.id)
    assert (row.status, row.owner_instance) == (JobStatus.COMPLETED, "peer")
    assert fake_log.spawns() == []  # it ran once, at the peer (simulated here)
    assert not (settings.state_dir / "spool" / sub.job.id).exists()  # not made again


async def test_a_started_run_is_never_requeued_even_if_its_supervisor_was_killed(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log,
                                          "started @sleep=60")
    spool = spool_of(settings, job_id)
    claim = sup.read_record(spool, sup.START_NAME)
    assert claim is not None and claim["kind"] == "supervisor"
    os.killpg(claim["pgid"], signal.SIGKILL)  # supervisor and CLI: no end record
    await wait_for(lambda: not proc.group_alive(claim["pgid"]))
    manager = await (await start_gateway(make_settings())).manager()
    row = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert row.status is JobStatus.FAILED and row.requeued_at is None
    assert len(fake_log.spawns()) == 1  # the spool record decided: it started, never again


# -- an owner that is SIGKILLed ------------------------------------------------------------


def start_owner(settings: Settings, tmp_path: Path, prompt: str, children: Children,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A gateway in a process of its own (tests/jobs/owner_gateway.py) that admits `prompt`;
    returns it (reaped at the test's end, its stdout closed) and the job id."""
    path = tmp_path / "owner-settings.pickle"
    path.write_bytes(pickle.dumps(settings))
    owner = children.track(subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.owner_gateway", str(path), "claude", prompt],
        cwd=REPO, stdout=subprocess.PIPE, text=True, stderr=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env}))
    assert owner.stdout is not None
    for line in owner.stdout:
        if line.startswith("JOB "):
            return owner, line.split()[1]
    raise AssertionError("the owner gateway did not start")


async def test_a_sigkilled_owners_run_is_adopted_by_a_running_peer_and_completes(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
    children: Children,
) -> None:
    settings = make_settings()
    peer = await (await start_gateway(settings)).manager()
    owner, job_id = start_owner(settings, tmp_path, "outlive my owner @sleep=1.5", children)
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    owner.kill()
    owner.wait()
    t0 = time.monotonic()
    await wait_for(lambda: job_id in peer.local_job_ids(), 10)
    # Proven gone on this host (its pid is dead): adopted in a sweep, not after a ttl.
    assert time.monotonic() - t0 < settings.lease.ttl_s
    row = await wait_for(lambda: terminal(peer, job_id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == peer.instance_id
    assert (await peer.reads.read_result(job_id)).output == "fake-claude answer: outlive my owner @sleep=1.5"


def zygote_of(owner: subprocess.Popen[str]) -> psutil.Process:
    """The owner's zygote: its child with `import zygote` on its command line (as
    bench/chaos.py finds it)."""
    for child in psutil.Process(owner.pid).children():
        if any("import zygote" in arg for arg in child.cmdline()):
            return child
    raise AssertionError(f"gateway {owner.pid} has no zygote")


async def test_an_owner_and_its_zygote_killed_together_lose_nothing_and_run_once(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
    children: Children,
) -> None:
    # Each is killed alone elsewhere (test_zygote.py, the chaos deck); here both go in one
    # instant, the way an OOM kill of the gateway's cgroup or a closed terminal takes them:
    # the forked supervisor leads a session of its own and must not need either.
    settings = make_settings()
    peer = await (await start_gateway(settings)).manager()
    go = tmp_path / "go"
    prompt = f"outlive owner and zygote @until={go}"
    owner, job_id = start_owner(settings, tmp_path, prompt, children)
    spawn = await wait_for(lambda: next(iter(fake_log.spawns()), None), 10)
    zygote = zygote_of(owner)
    claim = await wait_for(lambda: sup.read_record(spool_of(settings, job_id), sup.START_NAME))
    supervisor = int(claim["pid"])
    assert supervisor != zygote.pid and os.getsid(supervisor) == supervisor  # its own session
    os.kill(owner.pid, signal.SIGKILL)
    zygote.kill()
    owner.wait()
    await wait_for(lambda: not alive(zygote.pid), 10)
    assert alive(supervisor) and alive(spawn["pid"])  # the run goes on without either
    await wait_for(lambda: job_id in peer.local_job_ids(), 10)  # adopted while it runs
    go.touch()
    row = await wait_for(lambda: terminal(peer, job_id), DONE_S)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == peer.instance_id
    assert (await peer.reads.read_result(job_id)).output == f"fake-claude answer: {prompt}"
    assert len(fake_log.spawns()) == 1  # adopted, never launched again
    await wait_for(lambda: not alive(supervisor), DONE_S)


async def test_cancel_after_adoption_kills_a_grandchild_that_ignores_sigterm(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
    children: Children,
) -> None:
    settings = make_settings(limits={"kill_grace_s": 0.5})
    peer = await (await start_gateway(settings)).manager()
    owner, job_id = start_owner(settings, tmp_path, "stubborn @ignore-term @grandchild=60 @sleep=60",
                                children)
    spawn = await wait_for(lambda: next((e for e in fake_log.entries() if "grandchild_pid" in e),
                                        None))
    grandchild = spawn["grandchild_pid"]
    owner.kill()
    owner.wait()
    await wait_for(lambda: job_id in peer.local_job_ids(), 10)
    out = await peer.cancel(job_id)
    assert out.outcome == "cancelled" and out.job.status is JobStatus.CANCELLED
    await wait_for(lambda: not alive(grandchild), 10)
    assert not alive(spawn["parent_pid"])


async def test_a_cancel_of_a_job_orphaned_elsewhere_stops_its_process_here(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings()
    owner_gw = await start_gateway(settings)
    owner = await owner_gw.manager()
    judge = await start_gateway(settings)
    leases_of(judge).identity.hostname = "another-host"  # sees only the lease, not the process
    sub = await owner.submit("claude", SubmitRequest(prompt="orphaned but alive @sleep=60"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    pid = fake_log.spawns()[0]["pid"]
    await leases_of(owner_gw).stop()  # the owner stops heartbeating (as if SIGSTOPped)
    await wait_for(lambda: _status_is(owner, sub.job.id, JobStatus.ORPHANED), 10)
    assert alive(pid)
    here = await (await start_gateway(settings)).manager()
    out = await here.cancel(sub.job.id)
    assert out.outcome == "cancel_requested"
    await wait_for(lambda: not alive(pid), 10)
    # The stale owner's run ends; its guarded write heals the row to what really happened.
    row = await wait_for(lambda: _status_is(owner, sub.job.id, JobStatus.CANCELLED), DONE_S)
    assert row


async def _status_is(manager: Any, job_id: str, status: JobStatus) -> bool:
    return (await manager.reads.get(job_id)).status is status


def unshare_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-u", "true"], capture_output=True, timeout=scaled(10))
    return probe.returncode == 0


@pytest.mark.parametrize("backend", ["postgres"])  # hosts share a store only on PostgreSQL
async def test_a_gateway_on_another_host_never_orphans_a_running_detached_job(
    backend: str, make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
    children: Children,
) -> None:
    if not unshare_available():
        message = "needs root and unshare -u (a UTS namespace with another hostname)"
        if in_ci():  # CI runs as root on Linux: there it must run, never skip
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log,
                                          "far away @sleep=4")
    path = tmp_path / "peer-settings.pickle"
    path.write_bytes(pickle.dumps(settings))
    peer = children.track(subprocess.Popen(
        ["unshare", "-u", sys.executable, "-m", "tests.jobs.owner_gateway", str(path), "claude",
         "-", "other-host"], cwd=REPO, stdout=subprocess.PIPE, text=True,
        stderr=subprocess.DEVNULL))
    reader = await open_store(settings)  # reads only: no gateway here until the end
    try:
        assert peer.stdout is not None
        for line in peer.stdout:
            if line.startswith("READY"):
                break
        else:
            raise AssertionError("the gateway on the other host did not start")
        assert any(i.hostname == "other-host" for i in await reader.list_instances())
        # Many of the other host's sweeps, over several ttls, while the run goes on here.
        deadline = time.monotonic() + 3 * settings.lease.ttl_s
        while time.monotonic() < deadline:
            row = await reader.get_job(job_id)
            assert row is not None and row.status is JobStatus.RUNNING, row
            await anyio.sleep(0.1)
        # A gateway on the job's own host adopts and finalizes it; every host sees the result.
        here = await (await start_gateway(make_settings())).manager()
        done = await wait_for(lambda: terminal(here, job_id), DONE_S)
        assert done.status is JobStatus.COMPLETED
        final = await reader.get_job(job_id)
        assert final is not None and final.status is JobStatus.COMPLETED
    finally:
        peer.kill()  # reaped at the end (children)
        await reader.close()


async def test_a_run_detached_in_the_previous_releases_spool_layout_is_adopted(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    # Regression of 5869058: a 0.1.0 gateway kept a run's records in spool/<job id>/ itself
    # (no attempt dir); a newer gateway looked only in spool/<job id>/0 and the reaper
    # orphaned the run.
    settings, job_id = await detached_job(make_settings, start_gateway, fake_log,
                                          "old layout @sleep=0.3")
    attempt = spool_of(settings, job_id)
    await wait_for(lambda: sup.read_record(attempt, sup.END_NAME), DONE_S)
    for entry in list(attempt.iterdir()):
        entry.rename(attempt.parent / entry.name)
    attempt.rmdir()
    manager = await (await start_gateway(make_settings())).manager()
    row = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert row.status is JobStatus.COMPLETED
    assert (await manager.reads.read_result(job_id)).output == "fake-claude answer: old layout @sleep=0.3"


async def test_an_owner_killed_between_adoption_and_the_reaper_has_its_ended_run_finalized(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path,
    children: Children, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found by the portable detach chaos run on PostgreSQL: an owner SIGSTOPped past its
    # lease, its run ended; a peer's adoption saw the owner alive, the SIGKILL came, and the
    # same sweep's reaper probed again, saw it dead and wrote `orphaned` (final) over a run
    # whose end record sat unread in its spool. The reaper now follows adoption's judgement.
    settings = make_settings()
    owner, job_id = start_owner(settings, tmp_path, "ended under a frozen owner @sleep=0.3",
                                children, env={NO_FINALIZER_ENV: "1"})
    await wait_for(lambda: fake_log.spawns(), 10)
    os.kill(owner.pid, signal.SIGSTOP)
    spool = spool_of(settings, job_id)
    await wait_for(lambda: (spool / sup.END_NAME).exists(), DONE_S)
    claim = sup.read_record(spool, sup.START_NAME) or {}
    await wait_for(lambda: not alive(int(claim["pid"])), DONE_S)  # its supervisor left
    gw = await start_gateway(settings)
    store = store_of(gw)

    async def lapsed() -> bool:
        expired = await store.list_expired_candidates(settings.lease.http_job_grace_s)
        return job_id in {r.id for r in expired}

    await wait_for(lapsed, DONE_S)
    row = await store.get_job(job_id, with_output=False)
    assert row is not None and row.status is JobStatus.RUNNING, row
    adopter = leases_of(gw).adopter
    adopt = adopter.sweep
    killed: list[bool] = []

    async def adopt_then_kill_the_owner() -> int:
        taken = await adopt()  # it saw the owner alive (SIGSTOPped): taken == 0
        if not killed:
            owner.kill()  # between adoption and the reaper, in one sweep
            owner.wait()
            killed.append(True)
        return taken

    monkeypatch.setattr(adopter, "sweep", adopt_then_kill_the_owner)
    await wait_for(lambda: killed, DONE_S)
    manager = await gw.manager()
    ended = await wait_for(lambda: terminal(manager, job_id), DONE_S)
    assert ended.status is JobStatus.COMPLETED, ended
    assert ended.owner_instance == manager.instance_id
    assert (await manager.reads.read_result(job_id)).output == (
        "fake-claude answer: ended under a frozen owner @sleep=0.3")
