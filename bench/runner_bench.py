"""Benchmarks of the process runner (gateway/jobs/run/runner.py). Not part of the test suite.

How to run, from the repository root:

    uv run python bench/runner_bench.py                 # 1 GiB stream, 30 overhead runs
    uv run python bench/runner_bench.py --gib 2 --runs 50
    uv run python bench/runner_bench.py --skip-memory   # overhead only (no 1 GiB on disk)

It prints a small table and writes bench/results/runner.json. It needs about --gib GiB of
free space in the temp dir for the spool file (deleted afterwards).

1. memory: a child streams --gib GiB to stdout (`head -c N /dev/zero`, or a Python writer
   when `head` is missing) with max_output_bytes above that. The runner spools stdout to a
   file, so the gateway process should not grow: reported is the peak RSS growth of this
   process during the run, sampled with psutil every few ms (and the ru_maxrss high-water
   mark, which only grows if the run set a new peak). Target: < 5 MiB.
2. overhead: the same fake CLI is run --runs times through ProcessRun (start + wait) and
   --runs times spawned directly (asyncio.create_subprocess_exec in its own session, stdout
   and stderr to files, the same stdin payload if any, then wait), interleaved so drift hits
   both alike. Reported are the medians and their ratio. The fake is tests/fakes/bin/claude
   in print mode when it exists, else a tiny stdlib Python script. Run it on a quiet machine:
   other load shows up as noise in both medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import proc  # noqa: E402
from gateway.jobs.run.runner import ProcessRun  # noqa: E402
from gateway.jobs.run.spec import RunSpec  # noqa: E402
from providers.base import Invocation  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "runner.json"
FAKES_BIN = ROOT / "tests" / "fakes" / "bin"
MIB = 1024 * 1024
GIB = 1024 * MIB
RSS_SAMPLE_INTERVAL_S = 0.005  # fine enough to catch a transient buffer of a few MiB
RSS_TARGET_MIB = 5.0
WARMUP_RUNS = 3  # first spawns pay for imports, thread creation and page cache warmup


def _spec(spool: Path, invocation: Invocation, max_output_bytes: int) -> RunSpec:
    spool.mkdir(parents=True, exist_ok=True)  # the manager makes it before a launch
    return RunSpec(job_id="bench", invocation=invocation, spool_dir=spool, working_dir=None,
                   timeout_s=3600, idle_timeout_s=None, max_output_bytes=max_output_bytes,
                   kill_grace_s=5, secret_env=frozenset())


def _stream_invocation(n_bytes: int) -> tuple[Invocation, str]:
    head = shutil.which("head")
    if head:
        return Invocation(argv=[head, "-c", str(n_bytes), "/dev/zero"]), "head -c N /dev/zero"
    writer = (
        "import sys\nchunk = bytes(65536)\nleft = int(sys.argv[1])\n"
        "while left > 0:\n    n = min(left, len(chunk))\n"
        "    sys.stdout.buffer.write(chunk[:n])\n    left -= n\n"
    )
    return Invocation(argv=[sys.executable, "-S", "-c", writer, str(n_bytes)]), "python writer"


def _fake_invocation(workdir: Path) -> tuple[Invocation, str]:
    fake = FAKES_BIN / "claude"
    if fake.is_file() and os.access(fake, os.X_OK):
        # Plain print mode: the bench measures the runner, not an adapter's flag set.
        return (Invocation(argv=[str(fake), "--print", "--", "hello"]),
                "tests/fakes/bin/claude --print -- hello")
    script = workdir / "fake_cli.py"
    script.write_text("import sys\nprint('fake answer: ' + ' '.join(sys.argv[1:]))\n")
    return (Invocation(argv=[sys.executable, "-S", str(script), "--", "hello"]),
            "python -S script (tests/fakes/bin not present)")


async def bench_memory(gib: float, workdir: Path) -> dict[str, Any]:
    n_bytes = int(gib * GIB)
    invocation, source = _stream_invocation(n_bytes)
    me = psutil.Process()
    # One small run first, so that what the first run allocates once is in the baseline.
    warm = ProcessRun(_spec(workdir / "warm", _stream_invocation(MIB)[0], 2 * MIB))
    await warm.start()
    await warm.wait()

    spool = workdir / "memory"
    run = ProcessRun(_spec(spool, invocation, n_bytes + GIB))
    baseline_rss = me.memory_info().rss
    baseline_maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_rss = baseline_rss
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak_rss
        while not done.is_set():
            peak_rss = max(peak_rss, me.memory_info().rss)
            await asyncio.sleep(RSS_SAMPLE_INTERVAL_S)

    sampler = asyncio.create_task(sample(), name="bench_rss_sampler")
    started = time.perf_counter()
    await run.start()
    outcome = await run.wait()
    elapsed = time.perf_counter() - started
    done.set()
    await sampler
    peak_rss = max(peak_rss, me.memory_info().rss)
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spooled = outcome.stdout_path.stat().st_size
    shutil.rmtree(spool, ignore_errors=True)
    growth_mib = (peak_rss - baseline_rss) / MIB
    return {
        "child": source,
        "bytes_streamed": n_bytes,
        "bytes_spooled": spooled,
        "exit_code": outcome.exit_code,
        "error_kind": outcome.error_kind,
        "seconds": round(elapsed, 3),
        "throughput_mib_s": round(n_bytes / MIB / elapsed, 1),
        "baseline_rss_mib": round(baseline_rss / MIB, 2),
        "peak_rss_growth_mib": round(growth_mib, 3),
        # Linux reports ru_maxrss in KiB (macOS in bytes; this bench targets Linux).
        "ru_maxrss_growth_mib": round((maxrss_kib - baseline_maxrss_kib) / 1024, 3),
        "target_mib": RSS_TARGET_MIB,
        "within_target": growth_mib < RSS_TARGET_MIB and spooled == n_bytes,
    }


async def _direct_once(argv: list[str], stdin: bytes | None, spool: Path,
                       nice: int = 0) -> float:
    """The least a caller could do: spawn in its own session, output to files, wait.
    `nice`: lower the child's priority right after the spawn, as the gateway's runner does."""
    spool.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(spool / "stdout", "wb") as out, open(spool / "stderr", "wb") as err:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=out, stderr=err, start_new_session=True)
    if nice:
        proc.lower_priority(process.pid, nice)
    await process.communicate(stdin)
    return time.perf_counter() - started


async def _runner_once(invocation: Invocation, spool: Path) -> float:
    started = time.perf_counter()
    run = ProcessRun(_spec(spool, invocation, 64 * MIB))
    await run.start()
    outcome = await run.wait()
    elapsed = time.perf_counter() - started
    if outcome.error_kind is not None:
        raise RuntimeError(f"the fake failed under the runner: {outcome.error}")
    return elapsed


async def bench_overhead(runs: int, workdir: Path) -> dict[str, Any]:
    invocation, source = _fake_invocation(workdir)
    resolved = shutil.which(invocation.argv[0]) or invocation.argv[0]
    argv = [resolved, *invocation.argv[1:]]
    direct: list[float] = []
    runner: list[float] = []
    for i in range(WARMUP_RUNS + runs):
        d = await _direct_once(argv, invocation.stdin, workdir / "direct")
        r = await _runner_once(invocation, workdir / "runner")
        if i >= WARMUP_RUNS:
            direct.append(d)
            runner.append(r)
    direct_median = statistics.median(direct)
    runner_median = statistics.median(runner)
    return {
        "child": source,
        "runs": runs,
        "direct_median_ms": round(direct_median * 1000, 2),
        "runner_median_ms": round(runner_median * 1000, 2),
        "overhead_ms": round((runner_median - direct_median) * 1000, 2),
        "ratio": round(runner_median / direct_median, 3),
        "direct_p90_ms": round(statistics.quantiles(direct, n=10)[-1] * 1000, 2),
        "runner_p90_ms": round(statistics.quantiles(runner, n=10)[-1] * 1000, 2),
    }


def _table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    memory = results.get("memory")
    if memory:
        rows += [
            ("memory: child", memory["child"]),
            ("memory: streamed", f"{memory['bytes_streamed'] / GIB:.2f} GiB "
                                 f"in {memory['seconds']} s ({memory['throughput_mib_s']} MiB/s)"),
            ("memory: peak RSS growth", f"{memory['peak_rss_growth_mib']} MiB "
                                        f"(target < {memory['target_mib']} MiB)"),
            ("memory: ru_maxrss growth", f"{memory['ru_maxrss_growth_mib']} MiB"),
            ("memory: within target", str(memory["within_target"])),
        ]
    overhead = results.get("overhead")
    if overhead:
        rows += [
            ("overhead: child", overhead["child"]),
            ("overhead: direct median", f"{overhead['direct_median_ms']} ms"),
            ("overhead: runner median", f"{overhead['runner_median_ms']} ms"),
            ("overhead: runner - direct", f"{overhead['overhead_ms']} ms"),
            ("overhead: ratio", f"{overhead['ratio']}x over {overhead['runs']} runs each"),
        ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="runner-bench-") as tmp:
        workdir = Path(tmp)
        if not args.skip_memory:
            results["memory"] = await bench_memory(args.gib, workdir)
        if not args.skip_overhead:
            results["overhead"] = await bench_overhead(args.runs, workdir)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="GiB streamed (default 1)")
    parser.add_argument("--runs", type=int, default=30, help="overhead runs each (default 30)")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    # The runner's info logs would drown the table.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results = asyncio.run(main_async(args))
    print(_table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
