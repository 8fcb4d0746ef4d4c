"""PostgreSQL at the scale of many windows and a team (issue 29): rows that stay fast and one
sweeper per interval. Runnable alone (a few minutes on 2 cores; the seeding is most of it):

    uv run python bench/scale_bench.py                 # 1M terminal + 10k active, 20 sweepers
    uv run python bench/scale_bench.py --terminal 100000

1. rows: a table of `terminal` finished jobs (over the last day) and `active` running ones
   (1% of them with a dead owner), seeded in bulk as bench/store_bench.py does, ANALYZEd.
   Timed on the real store calls: `get_job(light)` (what `llm_job_status` reads) and
   `read_output` of a finished job's answer (`llm_job_result`), p99 over random ids;
   `insert_job` back to back (admission rate); one reaper pass (`LeaseKeeper.sweep_once`:
   adoption, candidates, liveness probes, the orphaning UPDATE, instance GC); then one
   retention pass over every terminal row, in its batches (each batch's time is how long it
   held its rows' locks: target < 1 s), and the table's size before and after.
2. sweepers: `instances` LeaseKeepers (each with its own store connection, its real loops)
   on one database, `sweep_interval_s` 0.5 for `seconds`: the claims counted in `sweeps`
   against the intervals that passed (at most one per interval; target: >= 90 % of the
   intervals had one) and the passes the keepers made.
3. wait latency: a job finished by one store connection while another waits on it the way
   `llm_job_wait` does for a job run elsewhere; from the terminal write to the waiter's
   answer, with LISTEN/NOTIFY and with the 1 s poll alone (the write lands at a random
   moment of the poll step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import store_bench
from bench.store_bench import (
    LIVE_OWNER,
    PostgresDb,
    _keeper,
    _renew,
    _seed_reaper_table,
)
from gateway import proc
from gateway.config import load_settings
from gateway.jobs.leases import LeaseKeeper
from gateway.jobs.manager import JobManager
from gateway.jobs.reads import REMOTE_POLL_S
from gateway.model import Completion, InstanceRow, JobStatus, NewJob
from gateway.store.base import RETENTION_BATCH_ROWS
from gateway.store.postgres.store import PostgresJobStore

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
READS = 2_000
ANSWERED = 200  # finished jobs with a real answer, for the result reads
ANSWER = "the answer " * 400  # 4.4 KB
ADMISSIONS = 500
TARGETS = {"status_p99_ms": 10.0, "reaper_pass_ms": 100.0, "retention_batch_max_ms": 1000.0,
           "sweeper_share": 0.9}


def _p99(samples: list[float]) -> float:
    return round(statistics.quantiles(samples, n=100)[98] * 1000, 3)


async def _answered_jobs(store: PostgresJobStore, n: int) -> list[str]:
    owner = f"bench-answers-{uuid.uuid4().hex[:6]}"
    ids = []
    for _ in range(n):
        job_id = str(uuid.uuid4())
        await store.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                      owner_instance=owner), 90.0)
        await store.mark_running(job_id, owner, 90.0)
        await store.complete(job_id, owner, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output=ANSWER,
            output_bytes=len(ANSWER), result_json=json.dumps({"text": ANSWER})))
        ids.append(job_id)
    return ids


async def _size(db: PostgresDb) -> int:
    conn = await db._conn()
    try:
        return int(await conn.fetchval("SELECT pg_total_relation_size('jobs')"))
    finally:
        await conn.close()


async def bench_rows(pg: Any, workdir: Path, terminal: int, active: int) -> dict[str, Any]:
    db = PostgresDb(pg)
    await db.open()
    try:
        seeded = time.perf_counter()
        expired = max(1, active // 100)
        await _seed_reaper_table(db, expired, active - expired, terminal)
        seed_s = time.perf_counter() - seeded
        store = db.store
        history = [f"hist-{i}" for i in random.sample(range(terminal), min(READS, terminal))]
        answered = await _answered_jobs(store, ANSWERED)
        status = []
        for job_id in history:
            started = time.perf_counter()
            assert await store.get_job(job_id, with_output=False) is not None
            status.append(time.perf_counter() - started)
        result = []
        for job_id in random.choices(answered, k=READS):
            started = time.perf_counter()
            assert await store.read_output(job_id, 0, 200_000, answer=True) is not None
            result.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(ADMISSIONS):
            job_id = str(uuid.uuid4())
            await store.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                          owner_instance=LIVE_OWNER), 90.0)
        admission_per_s = ADMISSIONS / (time.perf_counter() - started)
        keeper = _keeper(store, workdir)
        await keeper.register()
        await _renew(keeper)
        keeper._last_purge = time.monotonic()  # retention is timed on its own below
        started = time.perf_counter()
        orphaned = len(await keeper.sweep_once())
        reaper_ms = (time.perf_counter() - started) * 1000
        size_before = await _size(db)
        batches = []
        purged = 0
        pass_started = time.perf_counter()
        while True:
            started = time.perf_counter()
            ids = await store.purge_terminal(0.0, RETENTION_BATCH_ROWS)
            batches.append(time.perf_counter() - started)
            purged += len(ids)
            if len(ids) < RETENTION_BATCH_ROWS:
                break
        retention_s = time.perf_counter() - pass_started
        conn = await db._conn()
        try:
            await conn.execute("VACUUM jobs")  # what autovacuum does after a big delete
        finally:
            await conn.close()
        return {
            "terminal": terminal, "active": active, "expired": expired,
            "seed_s": round(seed_s, 1),
            "status_p99_ms": _p99(status), "status_median_ms": round(
                statistics.median(status) * 1000, 3),
            "result_p99_ms": _p99(result),
            "admission_per_s": round(admission_per_s, 1),
            "reaper_pass_ms": round(reaper_ms, 1), "reaper_orphaned": orphaned,
            "retention_rows": purged, "retention_batches": len(batches),
            "retention_batch_max_ms": round(max(batches) * 1000, 1),
            "retention_pass_s": round(retention_s, 2),
            "size_before_mb": round(size_before / 2**20, 1),
            "size_after_mb": round(await _size(db) / 2**20, 1),
        }
    finally:
        await db.close()


async def bench_sweepers(pg: Any, workdir: Path, instances: int, seconds: float,
                         interval_s: float = 0.5) -> dict[str, Any]:
    db = PostgresDb(pg)
    await db.open()
    stores: list[PostgresJobStore] = []
    keepers: list[LeaseKeeper] = []
    try:
        config = workdir / "sweepers.toml"
        config.write_text("")
        settings = load_settings(config, persistence={"backend": "memory"},
                                 lease={"sweep_interval_s": interval_s})
        for _ in range(instances):
            store = PostgresJobStore(db.dsn)
            await store.open()
            stores.append(store)
            instance_id = f"bench-sweeper-{uuid.uuid4().hex[:8]}"
            manager = JobManager(settings, store, instance_id, proc.hostname(), proc.boot_id())
            manager.admission.lease_renewed()
            keeper = LeaseKeeper(settings, store, manager, InstanceRow(
                instance_id=instance_id, hostname=proc.hostname(), boot_id=proc.boot_id(),
                pid=0, pid_started_at=None, role="bench", version="bench"),
                manager.spool_root)
            await keeper.start()
            keepers.append(keeper)
        task = f"reaper@{proc.hostname()}"
        await asyncio.sleep(2 * interval_s)  # every keeper registered and ticking
        runs_before, clock_before = await stores[0].sweep_runs(task), await stores[0].now()
        passes_before = sum(k.sweeps_run for k in keepers)
        await asyncio.sleep(seconds)
        runs = await stores[0].sweep_runs(task) - runs_before
        elapsed = await stores[0].now() - clock_before
        passes = sum(k.sweeps_run for k in keepers) - passes_before
        intervals = elapsed / interval_s
        return {"instances": instances, "interval_s": interval_s, "seconds": round(elapsed, 1),
                "intervals": round(intervals, 1), "claimed": runs, "passes": passes,
                "sweeper_share": round(runs / intervals, 3),
                "at_most_one_per_interval": runs <= elapsed / (interval_s * 0.9) + 1}
    finally:
        for keeper in keepers:
            await keeper.stop()
        for store in stores:
            await store.close()
        await db.close()


async def _cross_instance_wait(owner: PostgresJobStore, waiter: PostgresJobStore) -> float:
    """From the owner's terminal write to the end of a waiter's loop as JobReads.wait runs it
    (re-read the row after each wait_for_change of at most REMOTE_POLL_S)."""
    job_id = str(uuid.uuid4())
    await owner.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                  owner_instance="bench-owner"), 90.0)
    await owner.mark_running(job_id, "bench-owner", 90.0)
    ended = asyncio.Event()
    finished_at: list[float] = []

    async def wait() -> None:
        while True:
            row = await waiter.get_job(job_id, with_output=False)
            if row is not None and not row.status.is_active:
                finished_at.append(time.perf_counter())
                ended.set()
                return
            await waiter.wait_for_change(job_id, REMOTE_POLL_S)

    task = asyncio.create_task(wait())
    await asyncio.sleep(random.uniform(0.1, 1.1))  # the write lands anywhere in a poll step
    await owner.complete(job_id, "bench-owner", Completion(status=JobStatus.COMPLETED,
                                                           exit_code=0))
    written = time.perf_counter()
    await ended.wait()
    await task
    return finished_at[0] - written


async def bench_wait_latency(pg: Any, samples: int = 20) -> dict[str, Any]:
    """Cross-instance llm_job_wait latency with LISTEN/NOTIFY and with the poll alone."""
    db = PostgresDb(pg)
    await db.open()
    owner, waiter = PostgresJobStore(db.dsn), PostgresJobStore(db.dsn)
    await owner.open()
    await waiter.open()
    try:
        results: dict[str, Any] = {}
        for mode in ("notify", "poll"):
            waiter._notices.enabled = mode == "notify"
            latencies = [await _cross_instance_wait(owner, waiter) for _ in range(samples)]
            results[f"{mode}_median_ms"] = round(statistics.median(latencies) * 1000, 1)
            results[f"{mode}_max_ms"] = round(max(latencies) * 1000, 1)
        results["samples"] = samples
        return results
    finally:
        await owner.close()
        await waiter.close()
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--terminal", type=int, default=1_000_000)
    parser.add_argument("--active", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    def run(tmp: Path, server: Any | None) -> dict[str, Any]:
        assert server is not None  # required
        return {
            "machine": {"cpus": os.cpu_count(), "load": os.getloadavg(),
                        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
            "rows": asyncio.run(bench_rows(server, tmp, args.terminal, args.active)),
            "sweepers": asyncio.run(bench_sweepers(server, tmp, args.instances,
                                                   args.seconds)),
            "wait_latency": asyncio.run(bench_wait_latency(server)),
            "targets": TARGETS,
        }

    store_bench.bench_main("scale-bench-", RESULTS, run, postgres="required")


if __name__ == "__main__":
    main()
