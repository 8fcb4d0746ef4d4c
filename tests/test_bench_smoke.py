"""The benchmarks (bench/) still run: every code path with tiny sizes, no timing asserted.

The numbers these runs produce mean nothing (sizes of a handful); what is checked is that
every row of the table is produced from real measurements and written as JSON, so a change
to the gateway's tools or store that breaks the bench is caught by the suite, not on the
next benchmarking day.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

EVERY_ROW = {
    "sync_overhead", "sync_overhead_portable", "async_overhead", "admission",
    "admission_loaded", "admission_terminal",
    "status_roundtrip", "wait_roundtrip", "status_burst", "tasks_get_roundtrip", "result_roundtrip",
    "tasks_optin", "heartbeat_sqlite", "heartbeat_postgres", "reaper_sqlite",
    "reaper_postgres", "stream_runner", "stream_gateway", "rss_idle", "rss_after_jobs",
    "startup", "startup_cold", "startup_discover", "tools_none", "tools_three", "tools_largest",
    "supervisor_rss", "adopt_after_kill", "detach_after_signal", "finalize_at_start",
    "worktree_create", "sync_overhead_instant", "sync_overhead_instant_portable",
    "short_jobs", "short_jobs_wait_all", "short_jobs_portable", "burst_refused",
    "burst_terminal", "burst_refused_portable", "burst_terminal_portable", "zygote_rss",
    "forked_supervisor_rss",
}


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_bench_produces_every_row_and_writes_them_as_json(tmp_path: Path) -> None:
    bench = _load("run")
    output = tmp_path / "bench.json"

    results = bench.run(bench.SMOKE, output, use_postgres=False)

    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == EVERY_ROW
    measured = {key: row for key, row in rows.items() if not key.endswith("_postgres")}
    for key, row in measured.items():
        assert row["measured"] not in ("", "skipped"), key
    for key in ("sync_overhead", "sync_overhead_portable", "async_overhead", "admission",
                "status_roundtrip", "status_burst",
                "wait_roundtrip", "tasks_get_roundtrip", "result_roundtrip", "tasks_optin",
                "heartbeat_sqlite", "reaper_sqlite", "startup", "supervisor_rss",
                "adopt_after_kill", "detach_after_signal", "finalize_at_start",
                "sync_overhead_instant", "sync_overhead_instant_portable", "short_jobs",
                "short_jobs_wait_all", "short_jobs_portable", "burst_terminal",
                "burst_terminal_portable"):
        assert rows[key]["ratio"] > 0, key
    for key in ("short_jobs", "short_jobs_wait_all", "short_jobs_portable"):
        assert rows[key]["detail"]["statuses"] == {"completed": 16}, key
        cpu = rows[key]["detail"]["cpu_ms_per_job"]  # where a short job's CPU went
        assert set(cpu) == {"cli", "supervisor", "zygote", "gateway", "client"}, key
        assert cpu["cli"] > 0 and cpu["gateway"] > 0 and cpu["client"] > 0, key
    for key in ("burst_terminal", "burst_terminal_portable"):
        assert rows[key]["detail"]["statuses"] == {"completed": 20}, key
    assert rows["sync_overhead_instant"]["met"] == (
        rows["sync_overhead_instant"]["detail"]["overhead_ms"] <= 10.0)
    assert rows["heartbeat_postgres"]["measured"] == "skipped"
    assert rows["reaper_sqlite"]["detail"]["orphaned_per_sweep"] == [
        rows["reaper_sqlite"]["detail"]["expired"]]
    assert rows["stream_runner"]["detail"]["bytes_spooled"] == \
        rows["stream_runner"]["detail"]["bytes_streamed"]
    assert rows["admission_terminal"]["detail"]["statuses"] == {"completed": 5}
    assert "| startup: process start to first tools/list |" in results["table"]
    assert "jobs_status_lease_deadline" in results["plans"]
    assert json.loads(output.read_text()) == json.loads(json.dumps(results, default=str))


def test_store_bench_runs_on_postgres_and_shows_the_reapers_index(
        postgres_server: Any, tmp_path: Path) -> None:
    store_bench = _load("store_bench")

    with store_bench.quiet_logs():
        results = asyncio.run(store_bench.run_store_benches(
            tmp_path, postgres_server, heartbeat_sizes=(2, 20), heartbeat_reps=2,
            reaper_total=300, reaper_reps=1))

    for backend in ("sqlite", "postgres"):
        heartbeat = results["heartbeat"][backend]
        assert heartbeat["instance_renewed"] is True
        assert heartbeat["plan_heartbeat"]
        reaper = results["reaper"][backend]
        assert reaper["rows"] == 300
        assert reaper["orphaned_per_sweep"] == [3]
        assert reaper["index_used"] is True, reaper["plans"]


def test_usage_bench_runs_over_a_seeded_rollup(tmp_path: Path) -> None:
    usage_bench = _load("usage_bench")
    results = asyncio.run(usage_bench.bench_usage("sqlite", tmp_path, None, jobs=200,
                                                  floor_jobs=20, reps=1))
    assert results["provider_groups"] == 7 and results["model_groups"] == 6
    assert results["worst_ms"] > 0 and "met" in results
    json.dumps(results)


def test_dashboard_bench_times_every_page_and_a_live_update(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load("bench_dashboard")
    monkeypatch.setenv("HOME", os.environ.get("HOME", ""))  # the bench points HOME at its stores
    results = asyncio.run(bench.main_async(jobs=60, reps=2, live_reps=2))
    assert set(results["pages"]) == set(bench.pages(["id"]).keys())
    assert all(row["p95_ms"] > 0 for row in results["pages"].values())
    assert len(results["live"]["samples_s"]) == 2
    assert "jobs page p95" in bench.report(results)
    json.dumps(results)


def test_worker_bench_measures_claim_latency_and_three_workers(
        postgres_dsn: str, tmp_path: Path) -> None:
    worker_bench = _load("worker_bench")
    if not worker_bench.namespaces_available():
        pytest.skip("`unshare --uts` is not allowed here (needs root or user namespaces)")

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        latency = await worker_bench.claim_latency(tmp_path / "latency", postgres_dsn, 2)
        spread = await worker_bench.throughput(tmp_path / "throughput", postgres_dsn,
                                               jobs=6, slots=2, sleep_s=0.1)
        return latency, spread

    latency, spread = asyncio.run(both())
    assert latency and spread["jobs"] == 6 and spread["speedup"] > 0, (latency, spread)
    json.dumps([latency, spread])


def test_attempts_bench_admits_a_group_and_times_its_comparison() -> None:
    bench = _load("bench_attempts")
    result = asyncio.run(bench.main_async(rounds=1, files=20))
    assert result["rounds"] == 1 and result["files"] == 20
    assert result["admission_p95_s"] > 0 and result["complete_p95_s"] > 0
