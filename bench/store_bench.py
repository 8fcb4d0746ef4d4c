"""Store-level benchmarks: heartbeat cost against job count, and the reaper's sweep over a
large job table. Part of `bench/run.py`; runnable alone:

    uv run python bench/store_bench.py              # SQLite and PostgreSQL, full sizes
    uv run python bench/store_bench.py --no-postgres

1. heartbeat: one store holds `small` running jobs owned by the instance, another holds
   `large`; `store.heartbeat()` (the real call: renew the instance row, whose lease covers
   every job the instance owns) is timed on both, interleaved, and the medians are divided.
   The lease design promises a constant number of statements; this row shows whether the
   *time* is flat too. Target: large/small <= 3.
2. reaper: a table of `total` rows of which 1% are running jobs whose owner's lease expired,
   1% are running jobs of a live owner (their own deadlines passed long ago, as for any job
   older than ttl: the reaper must probe their owner's lease) and the rest are terminal
   history. One real
   `LeaseKeeper.sweep_once()` (candidates, liveness probe, orphaning UPDATE, instances GC) is
   timed; the expired rows are put back between repetitions (not timed). The floor is the
   same sweep over a table holding only the active rows (no history), so the ratio says
   whether history costs the sweep anything. The plans of the reaper's statements are shown
   (EXPLAIN ANALYZE inside a rolled-back transaction on PostgreSQL, EXPLAIN QUERY PLAN on
   SQLite).

Rows are inserted in bulk with one INSERT ... SELECT over a generated series per kind of row
(generate_series on PostgreSQL, a recursive CTE on SQLite), so 100,000 rows take about a
second. PostgreSQL tables are ANALYZEd after seeding, as autovacuum would have done on a
table that grew to this size; SQLite is left as the gateway leaves it (no ANALYZE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import structlog

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway import proc  # noqa: E402
from gateway.config import load_settings  # noqa: E402
from gateway.jobs.leases import LeaseKeeper  # noqa: E402
from gateway.jobs.manager import JobManager  # noqa: E402
from gateway.model import InstanceRow  # noqa: E402
from gateway.store.base import REAPER_BATCH_ROWS, JobStore  # noqa: E402
from gateway.store.postgres import sql as pg_sql  # noqa: E402
from gateway.store.postgres.store import PostgresJobStore  # noqa: E402
from gateway.store.sqlite import sql as sqlite_sql  # noqa: E402
from gateway.store.sqlite.store import SqliteJobStore  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "store.json"
TESTS_CONFTEST = ROOT / "tests" / "conftest.py"

TTL_S = 90.0  # lease.ttl_s default: live leases end this far in the future
EXPIRED_BY_S = 60.0  # expired leases ended this long ago (well past any grace for process jobs)
HISTORY_SPREAD_S = 86_400  # terminal rows finished over the last day (inside retention)
HTTP_GRACE_S = 300.0  # lease.http_job_grace_s default
LIVE_OWNER_TTL_S = 3600.0  # the live owner of the reaper table stays live through the whole run
HEARTBEAT_TARGET = 3.0
WARMUP = 3  # first calls pay for statement preparation and cold pages

HEARTBEAT_SIZES = (10, 10_000)
HEARTBEAT_REPS = 30
REAPER_TOTAL = 100_000
REAPER_REPS = 7

DEAD_OWNER = "bench-dead-instance"
LIVE_OWNER = "bench-live-instance"
HISTORY_OWNER = "bench-past-instance"  # terminal rows: never re-expired between repetitions
OTHER_HOST = "bench-other-host"  # candidates live elsewhere: the liveness probe never spares them


# -- PostgreSQL server (the test suite's throwaway server, reused) -----------------------------

def load_test_conftest() -> ModuleType:
    """tests/conftest.py as a module, for its PostgresServer (one way to run a throwaway
    server, shared by the tests and the bench)."""
    spec = importlib.util.spec_from_file_location("acg_tests_conftest", TESTS_CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class PgServer(Protocol):
    def create_database(self, name: str) -> None: ...

    def drop_database(self, name: str) -> None: ...

    def dsn_for(self, dbname: str) -> str: ...


def start_postgres() -> tuple[Any | None, str | None]:
    """A throwaway PostgreSQL server, or None and the reason it could not start."""
    conftest = load_test_conftest()
    try:
        return conftest._start_or_give_up(), None
    except Exception as exc:
        return None, str(exc)


# -- one database per case -------------------------------------------------------------------

class BenchDb(Protocol):
    backend: str

    @property
    def store(self) -> JobStore: ...  # read-only here: each backend holds its own store type

    async def seed(self, n: int, *, prefix: str, status: str, owner: str,
                   lease_offset_s: float | None, finished: bool) -> None: ...

    async def reexpire(self, owner: str) -> None: ...

    async def analyze(self) -> None: ...

    async def explain(self, sql: str, params: Any, *, analyze: bool) -> list[str]: ...

    async def count(self) -> int: ...

    async def close(self) -> None: ...


SQLITE_SEED = """
INSERT INTO jobs (id, provider, status, request_key, transport, owner_instance, lease_deadline,
                  hostname, boot_id, request_json, created_at, updated_at, started_at,
                  finished_at, forced, output_bytes, truncated)
WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < :n)
SELECT :prefix || '-' || i, 'claude', :status, :prefix || '-key-' || i, 'process', :owner,
       CASE WHEN :lease_offset_s IS NULL THEN NULL ELSE :now + :lease_offset_s END,
       :hostname, 'bench-boot', '{}', :now - (i % :spread), :now, :now - (i % :spread),
       CASE WHEN :finished THEN :now - (i % :spread) ELSE NULL END, 0, 0, 0
FROM seq"""

SQLITE_REEXPIRE = """
UPDATE jobs SET status = 'running', lease_deadline = :now - :expired_by, finished_at = NULL,
                error = NULL, error_kind = NULL
WHERE owner_instance = :owner"""


class SqliteDb:
    """A SQLite job store in its own file; seeding on a second (stdlib) connection."""

    backend = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store: SqliteJobStore = SqliteJobStore(path)

    async def open(self) -> None:
        await self.store.open()

    def _run(self, sql: str, params: dict[str, Any]) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, params)
            conn.execute("COMMIT")
        finally:
            conn.close()

    async def seed(self, n: int, *, prefix: str, status: str, owner: str,
                   lease_offset_s: float | None, finished: bool) -> None:
        if n <= 0:
            return
        self._run(SQLITE_SEED, {
            "n": n, "prefix": prefix, "status": status, "owner": owner,
            "lease_offset_s": lease_offset_s, "hostname": OTHER_HOST, "now": time.time(),
            "spread": HISTORY_SPREAD_S, "finished": finished,
        })

    async def reexpire(self, owner: str) -> None:
        self._run(SQLITE_REEXPIRE, {"now": time.time(), "expired_by": EXPIRED_BY_S,
                                    "owner": owner})

    async def analyze(self) -> None:
        """Nothing: the gateway never runs ANALYZE on SQLite, so the bench does not either."""

    async def explain(self, sql: str, params: Any, *, analyze: bool) -> list[str]:
        conn = sqlite3.connect(self.path)
        try:
            rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
        finally:
            conn.close()
        return [str(row[3]) for row in rows]

    async def count(self) -> int:
        conn = sqlite3.connect(self.path)
        try:
            return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])
        finally:
            conn.close()

    async def close(self) -> None:
        await self.store.close()


PG_SEED = """
INSERT INTO jobs (id, provider, status, request_key, transport, owner_instance, lease_deadline,
                  hostname, boot_id, request_json, created_at, updated_at, started_at,
                  finished_at, forced, output_bytes, truncated)
SELECT $1 || '-' || i, 'claude', $2, $1 || '-key-' || i, 'process', $3,
       CASE WHEN $4::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $4) END,
       $5, 'bench-boot', '{}', now() - make_interval(secs => i % $7), now(),
       now() - make_interval(secs => i % $7),
       CASE WHEN $8 THEN now() - make_interval(secs => i % $7) ELSE NULL END, false, 0, false
FROM generate_series(0, $6 - 1) AS i"""

PG_REEXPIRE = """
UPDATE jobs SET status = 'running', lease_deadline = now() - make_interval(secs => $2),
                finished_at = NULL, error = NULL, error_kind = NULL
WHERE owner_instance = $1"""


class PostgresDb:
    """A fresh database on the throwaway server, with the gateway's schema."""

    backend = "postgres"

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        server.create_database(self.name)
        self.dsn = server.dsn_for(self.name)
        self.store: PostgresJobStore = PostgresJobStore(self.dsn)

    async def open(self) -> None:
        await self.store.open()

    async def _conn(self) -> Any:
        import asyncpg

        return await asyncpg.connect(self.dsn)

    async def seed(self, n: int, *, prefix: str, status: str, owner: str,
                   lease_offset_s: float | None, finished: bool) -> None:
        if n <= 0:
            return
        conn = await self._conn()
        try:
            await conn.execute(PG_SEED, prefix, status, owner, lease_offset_s, OTHER_HOST, n,
                               HISTORY_SPREAD_S, finished)
        finally:
            await conn.close()

    async def reexpire(self, owner: str) -> None:
        conn = await self._conn()
        try:
            await conn.execute(PG_REEXPIRE, owner, EXPIRED_BY_S)
        finally:
            await conn.close()

    async def analyze(self) -> None:
        conn = await self._conn()
        try:
            await conn.execute("ANALYZE jobs")
            await conn.execute("ANALYZE gateway_instances")
        finally:
            await conn.close()

    async def explain(self, sql: str, params: Any, *, analyze: bool) -> list[str]:
        """The plan; with analyze, the statement really runs inside a transaction that is
        rolled back, so an UPDATE's plan shows actual rows and times but changes nothing."""
        conn = await self._conn()
        try:
            options = "(ANALYZE, BUFFERS, COSTS OFF)" if analyze else "(COSTS OFF)"
            tr = conn.transaction()
            await tr.start()
            try:
                rows = await conn.fetch(f"EXPLAIN {options} {sql}", *params)
            finally:
                await tr.rollback()
            return [str(row[0]) for row in rows]
        finally:
            await conn.close()

    async def count(self) -> int:
        conn = await self._conn()
        try:
            return int(await conn.fetchval("SELECT count(*) FROM jobs"))
        finally:
            await conn.close()

    async def close(self) -> None:
        await self.store.close()
        self.server.drop_database(self.name)


async def open_db(backend: str, workdir: Path, pg: PgServer | None, label: str) -> BenchDb:
    db: SqliteDb | PostgresDb
    if backend == "sqlite":
        db = SqliteDb(workdir / f"{label}-{uuid.uuid4().hex[:6]}.db")
    else:
        assert pg is not None
        db = PostgresDb(pg)
    await db.open()
    return db


def _identity(instance_id: str) -> InstanceRow:
    return InstanceRow(instance_id=instance_id, hostname=proc.hostname(), boot_id=proc.boot_id(),
                       pid=0, pid_started_at=None, role="bench", version="bench")


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _plan_uses_index(backend: str, plan: list[str], index: str) -> bool:
    text = "\n".join(plan)
    if backend == "postgres":
        return index in text and "Seq Scan on jobs" not in text
    return f"INDEX {index}" in text and not any(
        line.strip() == "SCAN jobs" for line in plan)


# -- heartbeat -------------------------------------------------------------------------------

async def bench_heartbeat(backend: str, workdir: Path, pg: PgServer | None, *,
                          sizes: tuple[int, int] = HEARTBEAT_SIZES,
                          reps: int = HEARTBEAT_REPS) -> dict[str, Any]:
    """Median heartbeat transaction with sizes[1] owned running jobs over sizes[0]."""
    small_n, large_n = sizes
    dbs: list[BenchDb] = []
    instance_ids: list[str] = []
    try:
        for n in sizes:
            db = await open_db(backend, workdir, pg, f"heartbeat-{n}")
            dbs.append(db)
            instance_id = f"bench-instance-{n}"
            instance_ids.append(instance_id)
            await db.store.register_instance(_identity(instance_id), TTL_S)
            await db.seed(n, prefix=f"hb{n}", status="running", owner=instance_id,
                          lease_offset_s=TTL_S, finished=False)
            await db.analyze()
        timings: list[list[float]] = [[], []]
        renewed_ok = True
        for rep in range(WARMUP + reps):
            for index, db in enumerate(dbs):
                instance_id = instance_ids[index]
                started = time.perf_counter()
                renewed = await db.store.heartbeat(instance_id, TTL_S)
                elapsed = time.perf_counter() - started
                renewed_ok = renewed_ok and renewed == 1
                if rep >= WARMUP:
                    timings[index].append(elapsed)
        small_med = statistics.median(timings[0])
        large_med = statistics.median(timings[1])
        large_db = dbs[1]
        if backend == "postgres":
            plan = await large_db.explain(pg_sql.RENEW_INSTANCE_LEASE,
                                          (instance_ids[1], TTL_S, None), analyze=True)
        else:
            plan = await large_db.explain(
                sqlite_sql.RENEW_INSTANCE_LEASE,
                {"instance_id": instance_ids[1], "now": time.time(), "ttl_s": TTL_S,
                 "renewal_wait_ms": None},
                analyze=False)
        ratio = large_med / small_med
        return {
            "backend": backend,
            "small_jobs": small_n, "large_jobs": large_n, "reps": reps,
            "small_median_ms": _ms(small_med), "large_median_ms": _ms(large_med),
            "small_p90_ms": _ms(statistics.quantiles(timings[0], n=10)[-1]) if reps >= 2 else None,
            "large_p90_ms": _ms(statistics.quantiles(timings[1], n=10)[-1]) if reps >= 2 else None,
            "per_job_us": round((large_med - small_med) / max(1, large_n - small_n) * 1e6, 3),
            "ratio": round(ratio, 3), "target": HEARTBEAT_TARGET,
            "within_target": ratio <= HEARTBEAT_TARGET,
            "instance_renewed": renewed_ok,
            "plan_heartbeat": plan,
        }
    finally:
        for db in dbs:
            await db.close()


# -- reaper ----------------------------------------------------------------------------------

async def _seed_reaper_table(db: BenchDb, expired: int, live: int, history: int) -> None:
    await db.store.register_instance(_identity(DEAD_OWNER), -EXPIRED_BY_S)
    await db.store.register_instance(_identity(LIVE_OWNER), LIVE_OWNER_TTL_S)
    await db.seed(expired, prefix="exp", status="running", owner=DEAD_OWNER,
                  lease_offset_s=-EXPIRED_BY_S, finished=False)
    await db.seed(live, prefix="live", status="running", owner=LIVE_OWNER,
                  lease_offset_s=-EXPIRED_BY_S, finished=False)
    await db.seed(history, prefix="hist", status="completed", owner=HISTORY_OWNER,
                  lease_offset_s=None, finished=True)
    await db.analyze()


def _keeper(store: JobStore, workdir: Path) -> LeaseKeeper:
    """The real reaper of one gateway instance on `store` (retention purge left out: it runs
    every 5 minutes, not every sweep)."""
    config = workdir / "reaper-config.toml"
    config.write_text("")
    settings = load_settings(config, persistence={"backend": "memory"},
                             lease={"http_job_grace_s": HTTP_GRACE_S})
    instance_id = f"bench-reaper-{uuid.uuid4().hex[:8]}"
    manager = JobManager(settings, store, instance_id, proc.hostname(), proc.boot_id())
    manager.admission.lease_renewed()
    keeper = LeaseKeeper(settings, store, manager, _identity(instance_id), manager.spool_root)
    return keeper


async def _sweep(keeper: LeaseKeeper) -> int:
    keeper._last_purge = time.monotonic()
    return len(await keeper.sweep_once())


async def _renew(keeper: LeaseKeeper) -> None:
    """Renew the reaper's own lease (untimed): a sweep judges others only while it is fresh
    on the store's clock, and seeding a large table takes longer than a ttl."""
    await keeper.heartbeat_once()


async def bench_reaper(backend: str, workdir: Path, pg: PgServer | None, *,
                       total: int = REAPER_TOTAL, reps: int = REAPER_REPS) -> dict[str, Any]:
    """Median sweep over `total` rows with 1% expired, over the same sweep without history."""
    expired = max(1, total // 100)
    live = expired
    history = total - expired - live
    dbs: list[BenchDb] = []
    try:
        big = await open_db(backend, workdir, pg, "reaper-big")
        dbs.append(big)
        floor = await open_db(backend, workdir, pg, "reaper-floor")
        dbs.append(floor)
        seed_started = time.perf_counter()
        await _seed_reaper_table(big, expired, live, history)
        seed_s = time.perf_counter() - seed_started
        await _seed_reaper_table(floor, expired, live, 0)
        rows_big = await big.count()
        keepers = [_keeper(big.store, workdir), _keeper(floor.store, workdir)]
        for keeper in keepers:
            await keeper.register()
        timings: list[list[float]] = [[], []]
        orphaned_counts: set[int] = set()
        warmup = 1
        for rep in range(warmup + reps):
            for index, db in enumerate(dbs):
                await db.reexpire(DEAD_OWNER)
                await _renew(keepers[index])
                started = time.perf_counter()
                orphaned = await _sweep(keepers[index])
                elapsed = time.perf_counter() - started
                orphaned_counts.add(orphaned)
                if rep >= warmup:
                    timings[index].append(elapsed)
        await big.reexpire(DEAD_OWNER)
        if backend == "postgres":
            plans = {
                "lock_expired_owners": await big.explain(
                    pg_sql.LOCK_EXPIRED_OWNERS, (), analyze=True),
                "list_expired_candidates": await big.explain(
                    pg_sql.LIST_EXPIRED_CANDIDATES, (HTTP_GRACE_S, REAPER_BATCH_ROWS),
                    analyze=True),
                "recover_expired_leases": await big.explain(
                    pg_sql.RECOVER_EXPIRED_LEASES,
                    (HTTP_GRACE_S, [row.id for row in await big.store.list_expired_candidates(
                        HTTP_GRACE_S)], "bench", [DEAD_OWNER], "bench"),
                    analyze=True),
            }
        else:
            params = {"now": time.time(), "http_grace_s": HTTP_GRACE_S, "job_ids": "[]",
                      "limit": REAPER_BATCH_ROWS, "orphaned_error": "bench",
                      "orphaned_by": "bench"}
            plans = {
                "list_expired_candidates": await big.explain(
                    sqlite_sql.LIST_EXPIRED_CANDIDATES, params, analyze=False),
                "recover_expired_leases": await big.explain(
                    sqlite_sql.RECOVER_EXPIRED_LEASES, params, analyze=False),
            }
        # The candidates by their lease; the UPDATE by the ids it was given (PostgreSQL: the
        # primary key) or by the same range (SQLite).
        index_used = all(
            _plan_uses_index(backend, plan, "jobs_status_lease_deadline")
            or (name == "recover_expired_leases" and _plan_uses_index(backend, plan, "jobs_pkey"))
            for name, plan in plans.items() if name != "lock_expired_owners")
        big_med = statistics.median(timings[0])
        floor_med = statistics.median(timings[1])
        return {
            "backend": backend, "rows": rows_big, "expired": expired, "live": live,
            "history": history, "reps": reps, "seed_s": round(seed_s, 3),
            "sweep_median_ms": _ms(big_med), "floor_median_ms": _ms(floor_med),
            "floor_rows": expired + live,
            "ratio": round(big_med / floor_med, 3),
            "per_expired_job_us": round(big_med / expired * 1e6, 2),
            "orphaned_per_sweep": sorted(orphaned_counts),
            "index_used": index_used, "plans": plans,
        }
    finally:
        for db in dbs:
            await db.close()


# -- standalone ------------------------------------------------------------------------------

@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The gateway's info logs (a reaper orphaning 1,000 jobs logs 1,000 lines) would drown
    the table. The previous structlog configuration is restored afterwards (the smoke test
    runs the bench inside the test process)."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    try:
        yield
    finally:
        structlog.configure(**saved)


async def run_store_benches(workdir: Path, pg: PgServer | None, *,
                            heartbeat_sizes: tuple[int, int] = HEARTBEAT_SIZES,
                            heartbeat_reps: int = HEARTBEAT_REPS,
                            reaper_total: int = REAPER_TOTAL,
                            reaper_reps: int = REAPER_REPS) -> dict[str, Any]:
    backends = ["sqlite"] + (["postgres"] if pg is not None else [])
    results: dict[str, Any] = {"heartbeat": {}, "reaper": {}}
    for backend in backends:
        results["heartbeat"][backend] = await bench_heartbeat(
            backend, workdir, pg, sizes=heartbeat_sizes, reps=heartbeat_reps)
        results["reaper"][backend] = await bench_reaper(
            backend, workdir, pg, total=reaper_total, reps=reaper_reps)
    return results


def bench_main(prefix: str, results_path: Path,
               run: Callable[[Path, Any | None], dict[str, Any]], *,
               postgres: str = "optional") -> None:
    """A store bench's main: a throwaway PostgreSQL server (`postgres`: "optional", "skip"
    or "required"), a temp workdir, quiet logs; `run(workdir, server or None)` measures,
    and its results are printed and written to `results_path`."""
    server, reason = (None, "skipped") if postgres == "skip" else start_postgres()
    if server is None and postgres == "required":
        sys.exit(f"{prefix.strip('-')}: no PostgreSQL server ({reason})")
    try:
        with quiet_logs(), tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            results = run(Path(tmp), server)
    finally:
        if server is not None:
            server.destroy()
    if server is None:
        results["postgres_skipped"] = reason
    print(json.dumps(results, indent=2))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    bench_main("store-bench-", RESULTS,
               lambda tmp, server: asyncio.run(run_store_benches(tmp, server)),
               postgres="skip" if args.no_postgres else "optional")


if __name__ == "__main__":
    main()
