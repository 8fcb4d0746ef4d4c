"""llm_usage over a store that has seen 1,000,000 jobs (issue 28). Runnable alone:

    uv run python bench/usage_bench.py              # SQLite and PostgreSQL
    uv run python bench/usage_bench.py --no-postgres

`llm_usage` reads the `usage_daily` rollup (one row per UTC day, provider, model and cost
source) that each job's terminal write adds to, never the jobs. The rollup is seeded with
what `jobs` terminal writes would have left in it: one INSERT ... SELECT ... GROUP BY over a
generated series of jobs spread over `days` days, 7 providers, 6 models and 4 cost sources
(the sums ADD_USAGE's upserts would have made, without a year of waiting). Then the real
call, `usage_report(store, group_by, since="30d")` (the tool's and the CLI's code path), is
timed for each grouping; the floor is the same call over a store that saw `floor_jobs` jobs,
so the ratio says whether a million jobs cost the answer anything. Target: <= 500 ms at 1M.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.config import load_settings  # noqa: E402
from gateway.jobs.usage_report import usage_report  # noqa: E402
from gateway.store import open_store  # noqa: E402
from gateway.store.base import JobStore  # noqa: E402

JOBS = 1_000_000
FLOOR_JOBS = 1_000
DAYS = 365  # a year of history
REPS = 15
TARGET_MS = 500.0
RESULTS = ROOT / "bench" / "results" / "usage_bench.json"

# n -> (day, provider, model, cost_source) of job n, and its figures; the same expression
# in both dialects (modulo arithmetic over the series).
_SELECT = """
SELECT {day} AS day,
       {pick}('claude','codex','gemini','grok','mistral','devin','cursor', n % 7) AS provider,
       {pick}('m0','m1','m2','m3','m4','m5', n % 6) AS model,
       {pick}('reported','estimated','absent','none', n % 4) AS cost_source,
       n
FROM series"""
_SEED = """
INSERT INTO usage_daily (day, provider, model, cost_source, jobs, input_tokens, output_tokens,
                         cache_read_tokens, cache_creation_tokens, cost_micro_usd)
SELECT day, provider, model, cost_source, COUNT(*), SUM(100 + n % 50), SUM(20 + n % 7),
       SUM(n % 3), NULL, CASE WHEN cost_source IN ('reported','estimated')
                              THEN SUM(1000 + n % 997) END
FROM ({select}) AS jobs GROUP BY day, provider, model, cost_source"""


def _load_store_bench() -> Any:
    spec = importlib.util.spec_from_file_location("acg_store_bench", ROOT / "bench" /
                                                  "store_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _open(backend: str, workdir: Path, dsn: str | None) -> JobStore:
    config = workdir / f"config-{backend}-{time.monotonic_ns()}.toml"
    config.write_text("")
    persistence: dict[str, object] = {"backend": backend}
    if backend == "sqlite":
        persistence["path"] = str(workdir / f"usage-{time.monotonic_ns()}.db")
    else:
        persistence["dsn"] = dsn
    return await open_store(load_settings(config, persistence=persistence))


async def _seed(store: JobStore, backend: str, jobs: int) -> None:
    if backend == "sqlite":
        select = _SELECT.format(day=f"date('now', '-' || (n % {DAYS}) || ' days')",
                                pick="_pick")
        sql = ("WITH RECURSIVE series(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM series "
               f"WHERE n + 1 < {jobs}) " + _SEED.format(select=select))
        db = store._connection()  # type: ignore[attr-defined]  # the bench seeds raw rows

        def pick(*args: Any) -> Any:
            return args[int(args[-1])]

        await db.create_function("_pick", -1, pick, deterministic=True)
        await db.execute(sql)
        await db.commit()
    else:
        select = _SELECT.format(
            day=f"to_char((now() AT TIME ZONE 'UTC') - make_interval(days => n % {DAYS}), "
                f"'YYYY-MM-DD')", pick="_pick")
        sql = (f"WITH series AS (SELECT generate_series(0, {jobs - 1}) AS n) "
               + _SEED.format(select=select))
        sql = sql.replace("_pick(", "(ARRAY[").replace(", n % 7)", "])[n % 7 + 1]").replace(
            ", n % 6)", "])[n % 6 + 1]").replace(", n % 4)", "])[n % 4 + 1]")
        async with store._connection("seed") as conn:  # type: ignore[attr-defined]
            await conn.execute("TRUNCATE usage_daily")  # one database for both sizes
            await conn.execute(sql)
            await conn.execute("ANALYZE usage_daily")


async def _time(store: JobStore, group_by: str, reps: int) -> tuple[float, dict[str, Any]]:
    timings = []
    report: dict[str, Any] = {}
    for _ in range(reps):
        started = time.perf_counter()
        report = await usage_report(store, group_by, since="30d")
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), report


async def bench_usage(backend: str, workdir: Path, dsn: str | None, *, jobs: int = JOBS,
                      floor_jobs: int = FLOOR_JOBS, reps: int = REPS) -> dict[str, Any]:
    results: dict[str, Any] = {"backend": backend, "jobs": jobs, "floor_jobs": floor_jobs}
    for label, count in (("big", jobs), ("floor", floor_jobs)):
        store = await _open(backend, workdir, dsn)
        try:
            started = time.perf_counter()
            await _seed(store, backend, count)
            results[f"{label}_seed_s"] = round(time.perf_counter() - started, 2)
            for group_by in ("provider", "model", "day"):
                median, report = await _time(store, group_by, reps)
                results[f"{label}_{group_by}_ms"] = round(median * 1000, 2)
                if label == "big":
                    results[f"{group_by}_groups"] = len(report["groups"])
        finally:
            await store.close()
    worst = max(results[f"big_{g}_ms"] for g in ("provider", "model", "day"))
    results["worst_ms"] = worst
    results["ratio"] = round(worst / max(results[f"floor_{g}_ms"]
                                         for g in ("provider", "model", "day")), 2)
    results["met"] = worst <= TARGET_MS
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    def run(tmp: Path, server: Any | None) -> dict[str, Any]:
        results = {"sqlite": asyncio.run(bench_usage("sqlite", tmp, None, jobs=args.jobs))}
        if server is not None:
            server.create_database("usage_bench")
            results["postgres"] = asyncio.run(bench_usage(
                "postgres", tmp, server.dsn_for("usage_bench"), jobs=args.jobs))
        return results

    _load_store_bench().bench_main("usage-bench-", RESULTS, run,
                                   postgres="skip" if args.no_postgres else "optional")


if __name__ == "__main__":
    main()
