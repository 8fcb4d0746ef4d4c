"""The dashboard over a store of 10,000 jobs (issue #41). Runnable alone:

    uv run python bench/bench_dashboard.py            # 10,000 jobs
    uv run python bench/bench_dashboard.py --smoke    # tiny sizes: does every path still run?

Two stores (SQLite), each with its own `agent-cli-gateway dashboard` process: one holding
`--jobs` jobs, the floor holding FLOOR_JOBS. The same pages are asked of both, interleaved,
and the server's own time is read from each answer's `Server-Timing` header (from the
request's arrival to the answer's head; a page is rendered whole before it). Rows: the jobs
page, its second page, a filter that matches few rows (a scan of the index), and a job's
page; each as p50/p95 and the ratio of the medians to the floor's, so a drifting machine
does not move the verdict. Targets: the jobs page p95 under 300 ms at 10,000 jobs; a status
change shows on an open page (the jobs table's event stream) within 1 s, p95, measured from
the store write to the event that carries the job's new row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.config import load_settings  # noqa: E402
from gateway.model import Completion, JobStatus, NewJob  # noqa: E402
from gateway.store import open_store  # noqa: E402
from gateway.store.base import JobStore  # noqa: E402

JOBS = 10_000
FLOOR_JOBS = 100
REPS = 40
LIVE_REPS = 20
PAGE_TARGET_MS = 300.0
LIVE_TARGET_S = 1.0
START_BOUND_S = 90.0
TTL_S = 3600.0
RESULTS = ROOT / "bench" / "results" / "bench_dashboard.json"
ADDRESS = re.compile(r"Dashboard: (http://\S+)")
TIMING = re.compile(r"app;dur=([0-9.]+)")


def new_job(n: int, owner: str) -> NewJob:
    return NewJob(id=str(uuid.uuid4()), provider=("claude", "codex", "gemini")[n % 3],
                  request_key=f"bench-{uuid.uuid4().hex}", owner_instance=owner,
                  transport="process", correlation_id=None, hostname=f"host-{n % 2}",
                  boot_id="boot", working_dir="/tmp", model=None, session_id=None,
                  request_json=json.dumps({"prompt": f"job number {n}: do the thing"}),
                  forced=True)


async def seed(store: JobStore, count: int) -> list[str]:
    """`count` jobs, nine in ten of them completed (what a table of history looks like)."""
    owner = "bench-instance"
    ids = []
    for n in range(count):
        job = new_job(n, owner)
        await store.insert_job(job, TTL_S)
        ids.append(job.id)
        if n % 10:
            await store.mark_running(job.id, owner, TTL_S)
            await store.complete(job.id, owner, Completion(status=JobStatus.COMPLETED,
                                                           exit_code=0, output="done"))
    return ids


@dataclass
class Dashboard:
    process: subprocess.Popen[str]
    base: str
    client: httpx2.Client


def write_config(root: Path) -> Path:
    config = root / "config.toml"
    config.write_text(tomli_w.dumps({"persistence": {"backend": "sqlite",
                                                     "path": str(root / "jobs.db")}}))
    return config


def start_dashboard(root: Path, config: Path) -> Dashboard:
    env = {**os.environ, "HOME": str(root)}
    process = subprocess.Popen([sys.executable, "-m", "gateway", "dashboard", "--config",
                                str(config)], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        found = ADDRESS.search(line)
        if found:
            address = found.group(1)
            client = httpx2.Client(timeout=30.0)
            exchanged = client.get(address)
            assert exchanged.status_code == 303, exchanged.status_code
            return Dashboard(process, address.split("?")[0], client)
        if not line:
            break
    process.kill()
    raise RuntimeError("the dashboard did not print its address")


def server_ms(dashboard: Dashboard, path: str) -> float:
    answer = dashboard.client.get(dashboard.base + path.lstrip("/"))
    assert answer.status_code == 200, (path, answer.status_code)
    found = TIMING.search(answer.headers.get("server-timing", ""))
    assert found, "no Server-Timing header"
    return float(found.group(1))


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def pages(ids: list[str]) -> dict[str, str]:
    return {"jobs page": "/", "second page": f"/?after={ids[max(len(ids) - 51, 0)]}",
            "few rows match (status=queued, provider=codex)": "/?status=queued&provider=codex",
            "a job's page": f"/jobs/{ids[len(ids) // 2]}"}


def measure_pages(big: Dashboard, floor: Dashboard, big_ids: list[str], floor_ids: list[str],
                  reps: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for (name, path), floor_path in zip(pages(big_ids).items(), pages(floor_ids).values(),
                                        strict=True):
        server_ms(big, path), server_ms(floor, floor_path)  # warm-up
        samples: list[float] = []
        floor_samples: list[float] = []
        for _ in range(reps):
            samples.append(server_ms(big, path))
            floor_samples.append(server_ms(floor, floor_path))
        rows[name] = {"p50_ms": statistics.median(samples), "p95_ms": p95(samples),
                      "floor_p50_ms": statistics.median(floor_samples),
                      "ratio": statistics.median(samples) / max(statistics.median(floor_samples),
                                                                0.001),
                      "samples_ms": samples}
    return rows


async def measure_live(store: JobStore, dashboard: Dashboard, reps: int) -> list[float]:
    """Seconds from a new job's INSERT to the event that carries its row."""
    delays = []
    with dashboard.client.stream("GET", dashboard.base + "events/jobs") as stream:
        lines = stream.iter_lines()
        for line in lines:  # the first `rows` event: the page as it is
            if line.startswith("event: rows"):
                break
        for n in range(reps):
            job = new_job(n, "bench-live")
            written = time.perf_counter()
            await store.insert_job(job, TTL_S)
            for line in lines:
                if job.id in line:
                    delays.append(time.perf_counter() - written)
                    break
    return delays


async def main_async(jobs: int, reps: int, live_reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        big_root, floor_root = Path(tmp) / "big", Path(tmp) / "floor"
        results: dict[str, Any] = {"jobs": jobs, "floor_jobs": FLOOR_JOBS}
        stores = []
        all_ids = []
        for root, count in ((big_root, jobs), (floor_root, FLOOR_JOBS)):
            root.mkdir()
            config = write_config(root)
            os.environ["HOME"] = str(root)
            store = await open_store(load_settings(config))
            started = time.perf_counter()
            all_ids.append(await seed(store, count))
            results.setdefault("seed_s", {})[root.name] = time.perf_counter() - started
            stores.append((store, config))
        big = start_dashboard(big_root, stores[0][1])
        floor = start_dashboard(floor_root, stores[1][1])
        try:
            results["pages"] = measure_pages(big, floor, all_ids[0], all_ids[1], reps)
            delays = await measure_live(stores[0][0], big, live_reps)
            results["live"] = {"p50_s": statistics.median(delays), "p95_s": p95(delays),
                               "samples_s": delays}
        finally:
            for dashboard in (big, floor):
                dashboard.client.close()
                dashboard.process.terminate()
                dashboard.process.wait(30)
                if dashboard.process.stdout is not None:
                    dashboard.process.stdout.close()
            for store, _ in stores:
                await store.close()
        return results


def report(results: dict[str, Any]) -> str:
    lines = [f"dashboard over {results['jobs']:,} jobs (floor: {results['floor_jobs']:,})",
             f"{'page':<48} {'p50 ms':>8} {'p95 ms':>8} {'floor p50':>10} {'ratio':>6}"]
    for name, row in results["pages"].items():
        lines.append(f"{name:<48} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
                     f"{row['floor_p50_ms']:>10.1f} {row['ratio']:>6.2f}")
    page = results["pages"]["jobs page"]["p95_ms"]
    live = results["live"]
    lines.append(f"jobs page p95 {page:.1f} ms (target < {PAGE_TARGET_MS:.0f} ms): "
                 f"{'ok' if page < PAGE_TARGET_MS else 'OVER'}")
    lines.append(f"live update p50 {live['p50_s'] * 1000:.0f} ms, p95 {live['p95_s'] * 1000:.0f} ms "
                 f"(target < {LIVE_TARGET_S * 1000:.0f} ms): "
                 f"{'ok' if live['p95_s'] < LIVE_TARGET_S else 'OVER'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    jobs, reps, live_reps = (200, 3, 3) if args.smoke else (args.jobs, REPS, LIVE_REPS)
    results = anyio.run(main_async, jobs, reps, live_reps)
    print(report(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
