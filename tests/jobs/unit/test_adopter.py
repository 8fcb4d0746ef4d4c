"""The adopter on the memory store with a fake run (gateway/jobs/adoption.py): what it does
with the jobs of an owner proven gone, the compare-and-set that gives each job exactly one
taker, and the bound on re-queues."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from gateway import proc
from gateway.config import Settings
from gateway.jobs.adoption import Adopter
from gateway.jobs.manager import JobManager
from gateway.jobs.requests import SubmitRequest, request_key, stored_request
from gateway.jobs.run import spool
from gateway.jobs.targets import resolve_target
from gateway.model import ErrorKind, InstanceRow, JobRow, JobStatus, NewJob
from gateway.store.base import TakeOver
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import (
    BOOT,
    HOST,
    WAIT_S,
    FakeLauncher,
    MakeManager,
    MakeSettings,
    StoreClock,
    identity,
)

pytestmark = pytest.mark.anyio

GONE = "gw-gone"  # the owner of the jobs settled here: its instance row says it stopped


async def gone_owners_job(settings: Settings, store: MemoryJobStore, job_id: str = "job-1",
                          *, running: bool = False, boot_id: str = BOOT,
                          owner: str = GONE, stopped: bool = True) -> JobRow:
    """A claude job of `owner`, queued (or inserted running), stored as admission stores it;
    the owner's row is stopped unless `stopped` is False (then it was collected)."""
    if stopped:
        await store.register_instance(identity(owner), 10)
        await store.mark_instance_stopped(owner)
    target = resolve_target(settings, "claude", SubmitRequest(prompt=f"task of {job_id}"))
    await store.insert_job(NewJob(
        id=job_id, provider="claude", request_key=request_key(target.normalized, None),
        owner_instance=owner, hostname=HOST, boot_id=boot_id,
        request_json=stored_request(target.normalized, None), running=running), 10)
    row = await store.get_job(job_id)
    assert row is not None
    return row


def adopter_of(manager: JobManager, grace_s: float = 300.0) -> Adopter:
    return Adopter(manager, manager.store, identity(manager.instance_id), manager.spool_root,
                   stalled_owner_grace_s=lambda: grace_s)


async def stored(store: MemoryJobStore, job_id: str) -> JobRow:
    row = await store.get_job(job_id)
    assert row is not None
    return row


async def test_a_gone_owners_queued_job_is_requeued_here_and_runs(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    manager = managers(settings, "gw-b")
    await gone_owners_job(settings, store)
    assert await adopter_of(manager).sweep() == 1
    row = await stored(store, "job-1")
    assert row.owner_instance == "gw-b" and row.requeue_count == 1
    (reason,) = json.loads(row.requeue_reasons or "[]")
    assert reason["reason"] == "owner_stopped" and reason["previous_owner"] == GONE
    (await launcher.run_of("job-1")).finish("ran after all")
    assert (await manager.reads.wait("job-1", WAIT_S)).status is JobStatus.COMPLETED


async def test_a_collected_owner_counts_as_gone(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    settings = unit_settings()
    await gone_owners_job(settings, store, stopped=False)
    assert await adopter_of(managers(settings, "gw-b")).sweep() == 1
    reasons = json.loads((await stored(store, "job-1")).requeue_reasons or "[]")
    assert [r["reason"] for r in reasons] == ["owner_collected"]


async def test_of_two_gateways_settling_the_same_job_at_once_exactly_one_takes_it(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    b, c = managers(settings, "gw-b"), managers(settings, "gw-c")
    seen = await gone_owners_job(settings, store)  # both judge from this same read
    taken = await asyncio.gather(adopter_of(b).settle(seen, "owner_stopped"),
                                 adopter_of(c).settle(seen, "owner_stopped"))
    assert sorted(taken) == [0, 1]
    winner = (b, c)[taken.index(1)]
    row = await stored(store, "job-1")
    assert row.owner_instance == winner.instance_id and row.requeue_count == 1
    await launcher.run_of("job-1")
    assert list(launcher.runs) == ["job-1"]
    assert winner.local_job_ids() == ["job-1"]
    assert (b, c)[taken.index(0)].limiter.snapshot()["running"] == 0  # the loser's slot went back


async def test_a_run_marked_running_but_never_claimed_is_requeued_by_one_gateway_only(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    b, c = managers(settings, "gw-b"), managers(settings, "gw-c")
    seen = await gone_owners_job(settings, store, running=True)
    # Its owner made the attempt dir and died before its supervisor claimed the run.
    spool.make_run_dir(spool.run_dir(b.spool_root, seen))
    taken = await asyncio.gather(adopter_of(b).settle(seen), adopter_of(c).settle(seen))
    assert sorted(taken) == [0, 1]
    row = await stored(store, "job-1")
    assert row.status in (JobStatus.QUEUED, JobStatus.RUNNING) and row.requeue_count == 1
    await launcher.run_of("job-1")
    assert list(launcher.runs) == ["job-1"]


async def test_a_run_of_a_previous_boot_is_never_requeued(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    seen = await gone_owners_job(settings, store, running=True, boot_id="an-earlier-boot")
    assert await adopter_of(managers(settings, "gw-b")).settle(seen) == 0
    row = await stored(store, "job-1")
    assert row.status is JobStatus.RUNNING and row.owner_instance == GONE
    assert launcher.runs == {}


async def test_a_gone_owners_job_with_a_cancel_request_ends_cancelled_instead(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher,
) -> None:
    settings = unit_settings()
    await gone_owners_job(settings, store)
    await store.request_cancel("job-1")
    assert await adopter_of(managers(settings, "gw-b")).sweep() == 1
    row = await stored(store, "job-1")
    assert row.status is JobStatus.CANCELLED and row.error == "Cancelled before it started."
    assert launcher.runs == {}


@pytest.mark.parametrize("ago", [[60, 30], [7200, 30]], ids=["both", "one an hour ago"])
async def test_past_max_requeues_in_an_hour_the_job_fails_instead_of_running_again(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    launcher: FakeLauncher, ago: list[float],
) -> None:
    settings = unit_settings(lease={"max_requeues": 2})
    row = await gone_owners_job(settings, store, owner="gw-first")
    now = await store.now()
    await requeued_to(store, row, GONE, [now - s for s in ago])  # re-queued twice before
    await store.mark_instance_stopped(GONE)
    assert await adopter_of(managers(settings, "gw-b")).sweep() == 1
    after = await stored(store, "job-1")
    if all(s < 3600 for s in ago):  # both in the last hour: the bound is reached
        assert after.status is JobStatus.FAILED and after.error_kind == ErrorKind.REQUEUE_LIMIT
        assert "lease.max_requeues = 2" in (after.error or "")
        assert launcher.runs == {}
    else:  # an older one does not count: re-queued a third time, and run
        assert after.requeue_count == 2 and after.status is not JobStatus.FAILED
        await launcher.run_of("job-1")


async def test_a_live_owners_job_is_left_to_it_until_it_stalls_past_the_grace(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings()
    # The owner is alive on this host (this very process) and stopped renewing a minute ago.
    me = InstanceRow(instance_id="gw-stalled", hostname=HOST, boot_id=BOOT, pid=os.getpid(),
                     pid_started_at=proc.process_start_time(os.getpid()), role="stdio",
                     version="unit")
    clock.move(-60)
    await store.register_instance(me, 10)
    await gone_owners_job(settings, store, owner="gw-stalled", stopped=False)
    clock.move(60)
    manager = managers(settings, "gw-b")
    assert await adopter_of(manager, grace_s=300).sweep() == 0
    assert (await stored(store, "job-1")).owner_instance == "gw-stalled"
    assert await adopter_of(manager, grace_s=30).sweep() == 1
    reasons = json.loads((await stored(store, "job-1")).requeue_reasons or "[]")
    assert [r["reason"] for r in reasons] == ["owner_stalled"]


async def test_an_instance_that_does_not_hold_its_lease_takes_nothing_over(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    settings = unit_settings()
    await gone_owners_job(settings, store)
    assert await adopter_of(managers(settings, "gw-b", admitting=False)).sweep() == 0
    assert (await stored(store, "job-1")).owner_instance == GONE


async def requeued_to(store: MemoryJobStore, row: JobRow, owner: str,
                      times: list[float]) -> None:
    """The row re-queued to `owner` with re-queues at `times` on record (the store's CAS,
    as a gateway that took the job over writes it)."""
    reasons = [{"at": at, "reason": "owner_dead", "previous_owner": "gw-older"} for at in times]
    await store.register_instance(identity(owner), 10)
    taken = await store.requeue_job(TakeOver(
        job_id=row.id, expected_owner=row.owner_instance, expected_status=row.status,
        instance_id=owner, hostname=HOST, boot_id=BOOT, ttl_s=10,
        requeue_reasons=json.dumps(reasons)))
    assert taken is not None
