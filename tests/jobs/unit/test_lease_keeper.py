"""The lease keeper on the memory store (gateway/jobs/leases.py): registration turns
admission on, heartbeats renew the lease, failed heartbeats turn it off, and the reaper
orphans exactly the jobs whose leases lapsed, never one of an owner that renews."""

from __future__ import annotations

import anyio
import pytest

from gateway.jobs.leases import LeaseKeeper
from gateway.jobs.run import spool
from gateway.jobs.run.spool import spool_root
from gateway.model import Completion, ErrorKind, JobStatus, NewJob
from gateway.store.base import StoreUnavailable
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import WAIT_S, MakeManager, MakeSettings, StoreClock, identity
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

LEASE = {"heartbeat_s": 5.0, "ttl_s": 10.0, "max_heartbeat_failures": 2}
ELSEWHERE = "other-host"  # a peer on another host: the reaper judges it by its lease alone


class FlakyHeartbeats(MemoryJobStore):
    """The memory store whose heartbeats fail while `down` (a store that went away)."""

    down = False

    async def heartbeat(self, instance_id: str, ttl_s: float,
                        renewal_wait_ms: float | None = None) -> int:
        if self.down:
            raise StoreUnavailable("the store is down")
        return await super().heartbeat(instance_id, ttl_s, renewal_wait_ms)


async def peer_job(store: MemoryJobStore, job_id: str, owner: str, ttl_s: float,
                   hostname: str = ELSEWHERE) -> None:
    """A running job of `owner` (registered now with `ttl_s`)."""
    await store.register_instance(identity(owner, hostname=hostname), ttl_s)
    await store.insert_job(NewJob(id=job_id, provider="claude", request_key=f"key-{job_id}",
                                  owner_instance=owner, hostname=hostname, boot_id="b",
                                  running=True), ttl_s)


async def dead_peer_job(store: MemoryJobStore, clock: StoreClock) -> None:
    """`dead-job`, running, of a peer on another host whose last heartbeat was a minute ago:
    its lease (and its owner's, 10 s) long lapsed."""
    clock.move(-60)
    await peer_job(store, "dead-job", "gw-dead", ttl_s=10)
    clock.move(60)


async def test_registering_turns_admission_on_and_a_heartbeat_renews_the_lease(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE)
    manager = managers(settings, admitting=False)
    keeper = LeaseKeeper(settings, store, manager, identity("gw-a"),
                         spool_root(settings.state_dir))
    assert not manager.admitting
    assert await keeper.register()
    assert manager.admitting
    (first,) = await store.list_instances()
    clock.move(3)
    await keeper.heartbeat_once()
    (renewed,) = await store.list_instances()
    assert first.lease_expires_at is not None and renewed.lease_expires_at is not None
    assert renewed.lease_expires_at.timestamp() - first.lease_expires_at.timestamp() >= 2.9


async def test_repeated_failed_heartbeats_turn_admission_off_until_one_succeeds(
    unit_settings: MakeSettings, managers: MakeManager,
) -> None:
    settings = unit_settings(lease=LEASE)
    store = FlakyHeartbeats()
    manager = managers(settings, admitting=False)
    manager.store = store
    keeper = LeaseKeeper(settings, store, manager, identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    store.down = True
    await keeper.heartbeat_once()
    assert manager.admitting  # one failure is within max_heartbeat_failures
    await keeper.heartbeat_once()
    assert not manager.admitting and keeper.heartbeat_failures == 2
    store.down = False
    await keeper.heartbeat_once()
    assert manager.admitting and keeper.heartbeat_failures == 0


async def test_a_heartbeat_that_renews_nothing_registers_again(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    settings = unit_settings(lease=LEASE)
    manager = managers(settings, admitting=False)
    keeper = LeaseKeeper(settings, store, manager, identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    await store.gc_instances(-LEASE["ttl_s"] - 1)  # collected, as if we had been stopped
    assert await store.list_instances() == []
    await keeper.heartbeat_once()
    assert [i.instance_id for i in await store.list_instances()] == ["gw-a"]


async def test_the_reaper_orphans_a_job_whose_owner_lease_lapsed_and_never_one_that_renews(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE)
    clock.move(-60)  # a minute ago: the dead peer's last heartbeat
    await peer_job(store, "dead-job", "gw-dead", ttl_s=10)
    clock.move(60)
    await peer_job(store, "live-job", "gw-live", ttl_s=10)
    keeper = LeaseKeeper(settings, store, managers(settings), identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    orphaned = await keeper.sweep_once()
    assert [row.id for row in orphaned] == ["dead-job"]
    dead, live = await store.get_job("dead-job"), await store.get_job("live-job")
    assert dead is not None and dead.status is JobStatus.ORPHANED
    assert dead.error_kind == ErrorKind.ORPHANED
    assert live is not None and live.status is JobStatus.RUNNING


async def test_a_job_whose_own_lease_is_fresh_is_not_orphaned_with_its_lapsed_owner(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE)
    clock.move(-60)
    await store.register_instance(identity("gw-dead", hostname=ELSEWHERE), 10)
    clock.move(60)
    await store.insert_job(NewJob(id="fresh", provider="claude", request_key="k",
                                  owner_instance="gw-dead", hostname=ELSEWHERE, boot_id="b"),
                           ttl_s=10)  # its own lease was just set: the later one counts
    keeper = LeaseKeeper(settings, store, managers(settings), identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    assert await keeper.sweep_once() == []


async def test_after_a_clock_step_the_reaper_judges_nobody_for_ttl_s(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE)
    await dead_peer_job(store, clock)
    keeper = LeaseKeeper(settings, store, managers(settings), identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    clock.move(LEASE["heartbeat_s"] + 1)  # a suspend and resume: every peer is late too
    await keeper.register()  # our own lease is fresh again on the new clock
    assert not keeper.may_judge(await store.now())
    assert await keeper.sweep_once() == []
    row = await store.get_job("dead-job")
    assert row is not None and row.status is JobStatus.RUNNING


async def test_an_instance_that_does_not_hold_its_lease_judges_nobody(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE)
    await dead_peer_job(store, clock)
    manager = managers(settings, admitting=False)
    keeper = LeaseKeeper(settings, store, manager, identity("gw-a"),
                         spool_root(settings.state_dir))
    assert await keeper.sweep_once() == []  # never registered: admission is off
    await keeper.register()
    keeper.skip_next_sweep = True  # a heartbeat fired late: our view is stale
    assert await keeper.sweep_once() == []
    assert [row.id for row in await keeper.sweep_once()] == ["dead-job"]


async def test_one_sweeper_per_interval_among_the_gateways_of_a_host(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    settings = unit_settings(lease=LEASE)
    keepers = [LeaseKeeper(settings, store, managers(settings, name), identity(name),
                         spool_root(settings.state_dir))
               for name in ("gw-a", "gw-b", "gw-c")]
    for keeper in keepers:
        await keeper.register()
    for keeper in keepers:
        await keeper.sweep_tick()
    assert [k.sweeps_run for k in keepers] == [1, 0, 0]


async def test_stopped_instances_are_collected_after_instance_gc_s(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease={**LEASE, "instance_gc_s": 30})
    clock.move(-60)
    await store.register_instance(identity("gw-gone"), 10)
    await store.mark_instance_stopped("gw-gone")
    clock.move(60)
    keeper = LeaseKeeper(settings, store, managers(settings), identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    await keeper.sweep_once()
    assert [i.instance_id for i in await store.list_instances()] == ["gw-a"]


async def test_the_lease_loops_renew_and_sweep_until_stopped(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
) -> None:
    settings = unit_settings(lease={"heartbeat_s": 0.02, "ttl_s": 1.0, "sweep_interval_s": 0.02,
                                    "cancel_poll_s": 0.02})
    keeper = LeaseKeeper(settings, store, managers(settings, admitting=False), identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.start()
    (registered,) = await store.list_instances()
    with anyio.fail_after(scaled(WAIT_S)):
        while keeper.sweeps_run < 2 or (await store.list_instances())[0].heartbeat_at == \
                registered.heartbeat_at:
            await anyio.sleep(0.01)
    await keeper.stop()
    swept = keeper.sweeps_run
    await anyio.sleep(0.1)
    assert keeper.sweeps_run == swept  # stopped: no loop ticks any more


async def test_retention_purges_old_ended_jobs_and_their_spools(
    unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore,
    clock: StoreClock,
) -> None:
    settings = unit_settings(lease=LEASE, persistence={"retention_days": 1})
    manager = managers(settings)
    clock.move(-2 * 86400)
    for job_id in ("old", "recent"):
        if job_id == "recent":
            clock.move(2 * 86400)
        await store.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                      owner_instance="gw-x"), 10)
        await store.complete(job_id, "gw-x", Completion(status=JobStatus.COMPLETED))
        spool.job_dir(manager.spool_root, job_id).mkdir(parents=True)
    keeper = LeaseKeeper(settings, store, manager, identity("gw-a"),
                         spool_root(settings.state_dir))
    await keeper.register()
    await keeper.sweep_once()
    assert await store.get_job("old") is None and await store.get_job("recent") is not None
    assert not spool.job_dir(manager.spool_root, "old").exists()
