"""Worker hosts (issue 42): claim latency and the throughput of 3 workers against one gateway.

Each "host" is a gateway or worker in a UTS namespace of its own with its own HOME, PATH and
fake CLIs (tests/workers/hosts.py), all on the PostgreSQL database `--dsn` names (a
throwaway one: the bench writes jobs into it). Needs `unshare --uts` (root).

- claim latency: one idle worker; a laptop gateway without codex submits `--latency-jobs`
  instant codex jobs one after the other (runs_on "any"); the latency of each is its row's
  started_at - created_at (the database clock: queued to running). p50 and p95.
- throughput: `--jobs` short jobs (`@sleep=S`) submitted at once, run by 3 workers of
  `--slots` runs each, against the same jobs run "here" by one gateway with the same
  `--slots` run slots; the ratio of the two wall times (what a team gains by its build boxes).

Usage:
    uv run python bench/worker_bench.py --dsn postgresql://...  [--jobs 60] [--slots 4]

Prints one JSON object. Timings are a machine's, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.jobs.placement import live_hosts  # noqa: E402
from tests.workers.hosts import Host, namespaces_available, observer, structured  # noqa: E402

READY_TIMEOUT_S = 120.0


async def call(client: Any, tool: str, **args: Any) -> dict[str, Any]:
    """A tool's structured answer; an error answer raises (a bench stops on it)."""
    result = await client.call_tool(tool, args)
    data = structured(result)
    if result.is_error:
        raise RuntimeError(f"{tool}: {data}")
    return data


async def _until(predicate: Any, timeout_s: float, step_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(step_s)


async def _workers_ready(store: Any, names: set[str]) -> bool:
    hosts = live_hosts(await store.list_instances(), await store.now())
    return names <= {h.hostname for h in hosts if "codex" in h.providers}


async def _ended(store: Any, ids: list[str]) -> bool:
    rows = [await store.get_job(i, with_output=False) for i in ids]
    return all(r is not None and r.status.is_terminal for r in rows)


async def _submit_all(client: Any, prompts: list[str], runs_on: str) -> list[str]:
    return [(await call(client, "codex_request_async", prompt=p, runs_on=runs_on))["job_id"]
            for p in prompts]


async def claim_latency(root: Path, dsn: str, jobs: int) -> dict[str, Any]:
    laptop = Host(root, "lat-laptop", dsn, ())
    worker = Host(root, "lat-worker", dsn, ("codex",))
    try:
        async with observer(dsn, root) as store:
            worker.start_worker()
            await _until(lambda: _workers_ready(store, {worker.name}), READY_TIMEOUT_S)
            latencies = []
            async with laptop.client() as client:
                await call(client, "gateway_status")
                for index in range(jobs):
                    [job_id] = await _submit_all(client, [f"latency-{index}"], "any")
                    await _until(lambda j=job_id: _ended(store, [j]), 60, 0.05)
                    row = await store.get_job(job_id, with_output=False)
                    assert row is not None and row.started_at and row.created_at
                    latencies.append((row.started_at - row.created_at).total_seconds())
    finally:
        worker.stop()
    latencies.sort()
    return {"claim_latency_p50_s": round(statistics.median(latencies), 3),
            "claim_latency_p95_s": round(latencies[max(0, int(len(latencies) * 0.95) - 1)], 3),
            "jobs": jobs}


async def throughput(root: Path, dsn: str, jobs: int, slots: int,
                     sleep_s: float) -> dict[str, Any]:
    prompts = [f"tp-{index} @sleep={sleep_s:g}" for index in range(jobs)]
    alone = Host(root, "tp-alone", dsn, ("codex",),
                 limits={"max_running_jobs": slots, "max_queued_jobs": jobs + 10})
    laptop = Host(root, "tp-laptop", dsn, (), worker={"queue_timeout_s": 600})
    workers = [Host(root, f"tp-w{n}", dsn, ("codex",), worker={"max_jobs": slots})
               for n in range(3)]
    try:
        async with observer(dsn, root) as store:
            async with alone.client() as client:
                started = time.monotonic()
                ids = await _submit_all(client, [f"{p} alone" for p in prompts], "here")
                await _until(lambda: _ended(store, ids), 600, 0.1)
                alone_s = time.monotonic() - started
            for worker in workers:
                worker.start_worker()
            await _until(lambda: _workers_ready(store, {w.name for w in workers}),
                         READY_TIMEOUT_S)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                started = time.monotonic()
                ids = await _submit_all(client, [f"{p} workers" for p in prompts], "any")
                await _until(lambda: _ended(store, ids), 600, 0.1)
                workers_s = time.monotonic() - started
            spread = {w.name: len(w.spawns()) for w in workers}
    finally:
        for worker in workers:
            worker.stop()
    return {"jobs": jobs, "slots_per_host": slots, "job_sleep_s": sleep_s,
            "one_gateway_s": round(alone_s, 2), "three_workers_s": round(workers_s, 2),
            "speedup": round(alone_s / workers_s, 2), "spread": spread}


async def run(dsn: str, jobs: int, slots: int, latency_jobs: int, sleep_s: float) -> int:
    if not namespaces_available():
        print(json.dumps({"error": "needs `unshare --uts` (root)"}))
        return 2
    with tempfile.TemporaryDirectory(prefix="worker-bench-") as tmp:
        root = Path(tmp)
        report = {"claim_latency": await claim_latency(root, dsn, latency_jobs),
                  "throughput": await throughput(root, dsn, jobs, slots, sleep_s)}
    print(json.dumps(report, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a throwaway PostgreSQL database")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--latency-jobs", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=1.0, help="each job's run, seconds")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.dsn, args.jobs, args.slots, args.latency_jobs, args.sleep))


if __name__ == "__main__":
    sys.exit(main())
