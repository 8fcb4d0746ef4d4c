"""A short chaos run over worker hosts (issue 42; the 200-job run is bench/worker_chaos.py):
a laptop gateway submits 40 codex jobs with runs_on="any" to 3 workers, each a host of its
own (UTS namespace, HOME, PATH), while one worker is SIGKILLed and restarted and another is
SIGSTOPped for a moment. Verdict: none lost (every job completes), none run twice (each
prompt spawned once across all hosts), none orphaned, and the load spread over the workers.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gateway.jobs.placement import live_hosts
from gateway.model import JobStatus
from gateway.store.base import JobStore
from tests.waiting import wait_for
from tests.workers.hosts import Host, need_namespaces, observer
from tests.workers.test_two_hosts import call

pytestmark = pytest.mark.anyio

JOBS = 40
WORKERS = ("w1", "w2", "w3")
TEST_TIMEOUT_S = 240.0
READY_TIMEOUT_S = 60.0
STOP_S = 0.8  # a SIGSTOP shorter than the lease: the stopped worker keeps its jobs
# Lease knobs with room for a loaded 2-core box running 5 gateways and PostgreSQL.
CHAOS_LEASE = {"heartbeat_s": 0.3, "ttl_s": 20.0, "http_job_grace_s": 20.0,
               "sweep_interval_s": 0.3, "instance_gc_s": 20.0, "cancel_poll_s": 0.3}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fleet(tmp_path: Path, postgres_dsn: str) -> Iterator[dict[str, Host]]:
    need_namespaces()
    made = {"laptop": Host(tmp_path, "laptop", postgres_dsn, (), lease=CHAOS_LEASE,
                           worker={"queue_timeout_s": 120.0})}
    for name in WORKERS:
        made[name] = Host(tmp_path, name, postgres_dsn, ("codex",), lease=CHAOS_LEASE,
                          worker={"max_jobs": 4})
    try:
        yield made
    finally:
        for host in made.values():
            host.stop()


async def ready(store: JobStore, names: tuple[str, ...]) -> bool:
    hosts = live_hosts(await store.list_instances(), await store.now())
    return {h.hostname for h in hosts if "codex" in h.providers} >= set(names)


async def test_forty_jobs_over_three_workers_under_kill_and_stop(
        fleet: dict[str, Host], postgres_dsn: str, tmp_path: Path) -> None:
    laptop = fleet["laptop"]
    workers = [fleet[name] for name in WORKERS]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            for worker in workers:
                worker.start_worker()
            await wait_for(lambda: ready(store, WORKERS), timeout=READY_TIMEOUT_S, step=0.1)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                ids = []
                for index in range(JOBS):
                    sleep = 0.3 + (index % 5) * 0.15
                    started = await call(client, "codex_request_async",
                                         prompt=f"job-{index} @sleep={sleep:g}", runs_on="any")
                    ids.append(started["job_id"])
                    if index == 12:  # mid-way: one worker dies with runs under way
                        await wait_for(lambda: workers[0].spawns(), timeout=30)
                        workers[0].signal(signal.SIGKILL)
                        workers[0].process.wait(10)  # type: ignore[union-attr]
                        workers[0].start_worker()  # restarted on its host: adopts its runs
                    if index == 24:  # another stalls, shorter than its lease
                        workers[1].signal(signal.SIGSTOP)
                        await anyio.sleep(STOP_S)
                        workers[1].signal(signal.SIGCONT)

                async def all_ended() -> bool:
                    rows = [await store.get_job(i, with_output=False) for i in ids]
                    return all(r is not None and r.status.is_terminal for r in rows)

                await wait_for(all_ended, timeout=150, step=0.25)
            rows = [await store.get_job(i, with_output=False) for i in ids]
    statuses = Counter(r.status for r in rows if r is not None)
    assert statuses == {JobStatus.COMPLETED: JOBS}, (statuses, [
        (r.id[:8], r.status, r.hostname, r.orphaned_by, r.started_at, r.pid) for r in rows
        if r is not None and r.status is not JobStatus.COMPLETED],
        [line for line in workers[0].stderr().splitlines()
         if "adopt" in line or "orphan" in line or "requeue" in line][-20:])
    spawned = Counter(s["prompt"].split()[0] for w in workers for s in w.spawns())
    assert set(spawned) == {f"job-{i}" for i in range(JOBS)}
    assert max(spawned.values()) == 1, [p for p, n in spawned.items() if n > 1]
    per_worker = {w.name: len(w.spawns()) for w in workers}
    assert all(count >= 3 for count in per_worker.values()), per_worker  # the load spread
    assert laptop.spawns() == []
