"""Worker hosts under the chaos monkey (issue 42): 200 jobs over 3 workers.

The long version of tests/workers/test_worker_chaos.py (40 jobs, one kill, one stop). A
laptop gateway without codex submits `--jobs` codex jobs with runs_on "any"; 3 workers,
each a host of its own (UTS namespace, HOME, PATH, fake CLIs: tests/workers/hosts.py), run
them on one PostgreSQL database (`--dsn`, a throwaway one; else a server of its own).
While jobs are queued or running, the monkey picks a worker every `--chaos-every` seconds
(give or take half) and either SIGKILLs it and starts it again on its host (it adopts the
runs it left), or SIGSTOPs it for less than a lease (it keeps its jobs).

Verdict, one line, and exit 1 when the promise broke:
- lost: jobs that did not end `completed` (every job can: the fakes always answer);
- duplicate_runs: prompts spawned more than once across all hosts;
- false_orphans: jobs ended `orphaned` (no SIGSTOP here outlives a lease);
- idle_while_queued: samples (every 0.5 s) in which a job was queued and a worker (not
  stopped, not starting again) had run nothing for 2 s: the load must spread. Reported
  with `spread`, the spawns per worker.

Usage:
    uv run python bench/worker_chaos.py [--dsn postgresql://...] [--jobs 200] [--seed N]

Needs `unshare --uts` (root). Timings are a machine's, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.worker_bench import call  # noqa: E402
from gateway.jobs.placement import live_hosts  # noqa: E402
from gateway.model import JobStatus  # noqa: E402
from gateway.store.base import JobStore  # noqa: E402
from tests.workers.hosts import Host, namespaces_available, observer  # noqa: E402

WORKERS = ("c1", "c2", "c3")
SLOTS = 4
READY_TIMEOUT_S = 120.0
IDLE_S = 2.0  # a worker that ran nothing this long while jobs queue: idle
RESTART_GRACE_S = 15.0  # a restarted worker's cold start (a loaded box), not idleness
SAMPLE_S = 0.5
# Room for a loaded 2-core box running 4 gateways and PostgreSQL (as in the test).
CHAOS_LEASE = {"heartbeat_s": 0.3, "ttl_s": 20.0, "http_job_grace_s": 20.0,
               "sweep_interval_s": 0.3, "instance_gc_s": 20.0, "cancel_poll_s": 0.3}


@dataclass
class Tally:
    kills: int = 0
    stops: int = 0
    idle_while_queued: int = 0
    paused_until: dict[str, float] = field(default_factory=dict)  # stopped or restarting
    idle_since: dict[str, float] = field(default_factory=dict)


async def _ready(store: JobStore) -> bool:
    hosts = live_hosts(await store.list_instances(), await store.now())
    return set(WORKERS) <= {h.hostname for h in hosts if "codex" in h.providers}


async def _rows(store: JobStore, ids: list[str]) -> list[Any]:
    return [await store.get_job(i, with_output=False) for i in ids]


async def monkey(workers: list[Host], every_s: float, rng: random.Random, tally: Tally,
                 done: asyncio.Event) -> None:
    """A kill and restart, or a stop shorter than a lease, of a random worker, until done."""
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), every_s * rng.uniform(0.5, 1.5))
            return
        except TimeoutError:
            pass
        victim = rng.choice(workers)
        if rng.random() < 0.5:
            victim.signal(signal.SIGKILL)
            await asyncio.to_thread(victim.process.wait, 10)  # type: ignore[union-attr]
            victim.start_worker()  # on its host again: adopts what it left
            tally.paused_until[victim.name] = time.monotonic() + RESTART_GRACE_S
            tally.kills += 1
        else:
            tally.stops += 1
            stop_s = rng.uniform(0.3, 2.0)
            tally.paused_until[victim.name] = time.monotonic() + stop_s + IDLE_S
            victim.signal(signal.SIGSTOP)
            await asyncio.sleep(stop_s)
            victim.signal(signal.SIGCONT)


async def watch_spread(store: JobStore, ids: list[str], workers: list[Host], tally: Tally,
                       done: asyncio.Event) -> None:
    """Count samples where jobs queued while a live worker with room sat idle for IDLE_S."""
    while not done.is_set():
        rows = [r for r in await _rows(store, ids) if r is not None]
        queued = sum(r.status is JobStatus.QUEUED for r in rows)
        running: Counter[str] = Counter(r.hostname for r in rows
                                        if r.status is JobStatus.RUNNING)
        now = time.monotonic()
        for worker in workers:
            paused = now < tally.paused_until.get(worker.name, 0.0)
            if paused or running[worker.name] or not queued:
                tally.idle_since.pop(worker.name, None)
                continue
            since = tally.idle_since.setdefault(worker.name, now)
            if now - since >= IDLE_S:
                tally.idle_while_queued += 1
        await asyncio.sleep(SAMPLE_S)


async def run(dsn: str, jobs: int, every_s: float, seed: int) -> int:
    if not namespaces_available():
        print(json.dumps({"error": "needs `unshare --uts` (root)"}))
        return 2
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="worker-chaos-") as tmp:
        root = Path(tmp)
        laptop = Host(root, "laptop", dsn, (), lease=CHAOS_LEASE,
                      worker={"queue_timeout_s": 1800.0},
                      limits={"max_queued_jobs": jobs + 10})
        workers = [Host(root, name, dsn, ("codex",), lease=CHAOS_LEASE,
                        worker={"max_jobs": SLOTS}) for name in WORKERS]
        tally = Tally()
        started = time.monotonic()
        try:
            async with observer(dsn, root) as store:
                for worker in workers:
                    worker.start_worker()
                deadline = time.monotonic() + READY_TIMEOUT_S
                while not await _ready(store):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the workers never published codex")
                    await asyncio.sleep(0.1)
                done = asyncio.Event()
                ids: list[str] = []
                async with laptop.client() as client:
                    await call(client, "gateway_status")
                    chaos = asyncio.create_task(monkey(workers, every_s, rng, tally, done))
                    spread = asyncio.create_task(watch_spread(store, ids, workers, tally,
                                                              done))
                    for index in range(jobs):
                        sleep = 0.3 + (index % 7) * 0.2
                        answer = await call(client, "codex_request_async",
                                             prompt=f"job-{index} @sleep={sleep:g}",
                                             runs_on="any")
                        ids.append(answer["job_id"])
                    while True:
                        rows = await _rows(store, ids)
                        if all(r is not None and r.status.is_terminal for r in rows):
                            break
                        if time.monotonic() - started > 60 + jobs * 3:
                            break  # reported as unfinished, not waited on for ever
                        await asyncio.sleep(0.5)
                    done.set()
                    await asyncio.gather(chaos, spread)
                rows = await _rows(store, ids)
        finally:
            for host in (laptop, *workers):
                host.stop()
        spawned = Counter(s["prompt"].split()[0] for w in workers for s in w.spawns())
        statuses = Counter(r.status.value if r is not None else "missing" for r in rows)
        report = {
            "jobs": jobs, "completed": statuses.get("completed", 0),
            "lost": jobs - statuses.get("completed", 0),
            "duplicate_runs": sum(1 for n in spawned.values() if n > 1),
            "false_orphans": statuses.get("orphaned", 0),
            "never_spawned": jobs - len(spawned),
            "idle_while_queued": tally.idle_while_queued,
            "statuses": dict(statuses), "kills": tally.kills, "stops": tally.stops,
            "spread": {w.name: len(w.spawns()) for w in workers},
            "laptop_spawns": len(laptop.spawns()),
            "wall_s": round(time.monotonic() - started, 1), "seed": seed,
        }
    print(json.dumps(report))
    broken = (report["lost"] or report["duplicate_runs"] or report["false_orphans"]
              or report["laptop_spawns"])
    return 1 if broken else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None,
                        help="a throwaway PostgreSQL database (default: a server of its own, "
                             "tests/conftest.py's, deleted at the end)")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--chaos-every", type=float, default=4.0,
                        help="seconds between the monkey's moves (give or take half)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    # The observer store logs in this process: to stderr, warnings only (stdout: the verdict).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    if args.dsn is not None:
        return asyncio.run(run(args.dsn, args.jobs, args.chaos_every, seed))
    from tests.conftest import _start_or_give_up

    server = _start_or_give_up()
    try:
        server.create_database("worker_chaos")
        return asyncio.run(run(server.dsn_for("worker_chaos"), args.jobs, args.chaos_every,
                               seed))
    finally:
        server.destroy()


if __name__ == "__main__":
    raise SystemExit(main())
