"""`[limits] provider_nice`, both sides measured in one run (issue #45 item 4).

What the setting trades, with the gateway's own mechanism (`proc.lower_priority`: the
group's nice value and, where Linux schedules by autogroup, its session's), each value
measured in turns with the others (ABAB), every process in a session of its own as a
provider's run is:

- **the provider's side**: a CPU-bound "provider" doing a fixed amount of work while
  OTHER_WORK un-niced CPU-bound processes stand for the rest of a busy box (other
  programs, other users' tests); its wall time at each nice value, and the ratio to nice 0;
- **the gateway's side**: this process's event loop (the gateway's stand-in: its heartbeat
  and MCP answers are callbacks on such a loop) while PROVIDERS CPU-bound providers run at
  the nice value: how late a 5 ms timer fires (median, p99, worst). A lease renewal is one
  such callback; the default `ttl_s` of 90 s outlasts any lateness measured here.

    uv run python bench/nice_bench.py                 # 0 vs 10 (the default), 3 rounds
    uv run python bench/nice_bench.py --values 0 5 10 19 --rounds 2

Every process it starts is killed before it returns (bounded: each phase lasts seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import proc  # noqa: E402
from gateway.config import PROVIDER_NICE_DEFAULT  # noqa: E402

PROVIDERS = 32  # the default max_running_jobs: the most CPU-bound runs a gateway starts
OTHER_WORK = 4  # un-niced CPU-bound processes standing for the rest of a busy 2-core box
WORK_LOOPS = 3_000_000  # the provider's fixed work: ~0.15 s of CPU on a quiet 2-core box
TIMER_S = 0.005  # the loop's probe timer
PROBE_S = 2.0  # how long the loop is probed per value
HOG = "while True: pass"
WORK = f"n = 0\nfor i in range({WORK_LOOPS}): n += i\n"


def _spawn(code: str, nice: int) -> subprocess.Popen[bytes]:
    """A Python process in a session of its own (as a run is), niced as the runner does."""
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    if nice:
        proc.lower_priority(child.pid, nice)
    return child


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    for child in children:
        child.wait()


def provider_wall_s(nice: int) -> float:
    """The fixed work's wall time at `nice`, with OTHER_WORK un-niced hogs running."""
    others = [_spawn(HOG, 0) for _ in range(OTHER_WORK)]
    try:
        time.sleep(0.2)  # the hogs are running
        started = time.perf_counter()
        worker = _spawn(WORK, nice)
        worker.wait()
        return time.perf_counter() - started
    finally:
        _stop(others)


async def _lateness(duration_s: float) -> list[float]:
    late: list[float] = []
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        asked = time.perf_counter()
        await asyncio.sleep(TIMER_S)
        late.append(time.perf_counter() - asked - TIMER_S)
    return late


def loop_lateness_ms(nice: int) -> dict[str, float]:
    """How late this loop's 5 ms timer fires while PROVIDERS hogs run at `nice`."""
    providers = [_spawn(HOG, nice) for _ in range(PROVIDERS)]
    try:
        time.sleep(0.3)  # all running, their autogroups niced (EAGAIN retries aside)
        for child in providers:  # the kernel's 100 ms autogroup rate limit: once more
            proc.lower_priority(child.pid, nice)
        late = sorted(asyncio.run(_lateness(PROBE_S)))
    finally:
        _stop(providers)
    return {"median_ms": 1000 * statistics.median(late),
            "p99_ms": 1000 * late[int(0.99 * (len(late) - 1))], "worst_ms": 1000 * late[-1],
            "timers": len(late)}


def run(values: list[int], rounds: int) -> dict[str, Any]:
    walls: dict[int, list[float]] = {v: [] for v in values}
    loops: dict[int, list[dict[str, float]]] = {v: [] for v in values}
    for _ in range(rounds):  # ABAB: each value in turn, so drift hits all alike
        for value in values:
            walls[value].append(provider_wall_s(value))
        for value in values:
            loops[value].append(loop_lateness_ms(value))
    base = statistics.median(walls[values[0]])
    rows = {}
    for value in values:
        wall = statistics.median(walls[value])
        rows[value] = {
            "provider_wall_s": wall, "provider_vs_first": wall / base,
            "loop_late_median_ms": statistics.median(r["median_ms"] for r in loops[value]),
            "loop_late_p99_ms": statistics.median(r["p99_ms"] for r in loops[value]),
            "loop_late_worst_ms": max(r["worst_ms"] for r in loops[value]),
        }
    return {"values": values, "rounds": rounds, "providers": PROVIDERS,
            "other_work": OTHER_WORK, "load_at_start": os.getloadavg()[0], "rows": rows,
            "raw": {"walls": walls, "loops": loops}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, nargs="+", default=[0, PROVIDER_NICE_DEFAULT])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    result = run(args.values, args.rounds)
    print(f"load {result['load_at_start']:.1f}, {PROVIDERS} providers / {OTHER_WORK} other "
          f"un-niced processes, {args.rounds} rounds")
    print("provider_nice | CPU-bound provider, busy box | vs first | loop late median / p99"
          " / worst (32 CPU-bound providers)")
    for value, row in result["rows"].items():
        print(f"{value:>13} | {row['provider_wall_s']:.2f} s | {row['provider_vs_first']:.2f} | "
              f"{row['loop_late_median_ms']:.1f} / {row['loop_late_p99_ms']:.1f} / "
              f"{row['loop_late_worst_ms']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
