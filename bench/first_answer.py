"""Process start to the first answer to `initialize`, for any stdio MCP servers, in turns
(issue #45 item 1: within 1.0x the anchor's and at most 1.10x the SDK's minimal server).

A client's first question, written as raw JSON-RPC on the server's stdin the moment it is
started; the clock stops when the answer's line arrives on its stdout. Raw on purpose: the
same bytes for every server, whatever it is written in, so the anchor (a Node program) and
ours are timed alike. Each round starts every server once, in the order given (ABAB); the
first round warms the page cache and is not counted. Medians, and the median of each
server's ratio to the first one within a round (a round sees one speed of the box).

    uv run python bench/first_answer.py --runs 10 \\
        minimal="<user-venv>/bin/python bench/minimal_server.py" \\
        gateway="<user-venv>/bin/python -m gateway" \\
        anchor="node <anchor checkout>/dist/index.js"

Each server gets a fresh HOME (so a fresh store) in a temp dir; PYTHONPATH is this
checkout. Every process started is killed before the next starts.

Beside the wall time, the CPU time the server used until its answer (user + system, from
`wait4` once it is killed at the answer): on a loaded box the wall time is mostly waiting
for a core, and the CPU time is what the server itself spends, so its ratio is the one a
busy 2-core box can still read (the wall ratio moved by +-10% between runs at load 10).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANSWER_TIMEOUT_S = 60.0  # a start under heavy load takes seconds; a hang fails the bench
INITIALIZE = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "first-answer-bench", "version": "1"}},
}) + "\n"


def first_answer_s(argv: list[str], home: Path) -> tuple[float, float]:
    """Seconds from the spawn to the answer's line on stdout, and the CPU seconds the
    server spent until then (it is killed at once when the answer arrives)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONDONTWRITEBYTECODE",) and not k.startswith("AGENT_GATEWAY_")}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, cwd=home)
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(INITIALIZE.encode())
        server.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(server.stdout, selectors.EVENT_READ)
            if not selector.select(ANSWER_TIMEOUT_S):
                raise RuntimeError(f"{argv}: no answer within {ANSWER_TIMEOUT_S} s")
            line = server.stdout.readline()
        elapsed = time.perf_counter() - started
        server.kill()
        _, status, usage = os.wait4(server.pid, 0)
        server.returncode = os.waitstatus_to_exitcode(status)
        if b'"id":1' not in line.replace(b" ", b""):
            raise RuntimeError(f"{argv}: not an answer to initialize: {line[:200]!r}")
        return elapsed, usage.ru_utime + usage.ru_stime
    finally:
        if server.returncode is None:
            server.kill()
            server.wait()


def run(servers: dict[str, list[str]], runs: int, workdir: Path) -> dict[str, Any]:
    names = list(servers)
    samples: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in names}
    load_at_start = os.getloadavg()[0]
    for i in range(runs + 1):
        this_round = {name: first_answer_s(argv, workdir / f"{name}-{i}")
                      for name, argv in servers.items()}
        if i:
            first_wall, first_cpu = this_round[names[0]]
            for name in names:
                wall, used = this_round[name]
                samples[name].append(wall)
                ratios[name].append(wall / first_wall)
                cpu[name].append(used)
                cpu_ratios[name].append(used / first_cpu)
    return {"runs": runs, "load_at_start": load_at_start, "load_at_end": os.getloadavg()[0],
            "rows": {name: {"median_ms": 1000 * statistics.median(samples[name]),
                            f"ratio_to_{names[0]}": statistics.median(ratios[name]),
                            "median_cpu_ms": 1000 * statistics.median(cpu[name]),
                            f"cpu_ratio_to_{names[0]}": statistics.median(cpu_ratios[name])}
                     for name in names},
            "raw": samples, "raw_cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("servers", nargs="+", metavar="NAME=COMMAND")
    args = parser.parse_args()
    servers = {name: shlex.split(command)
               for name, command in (item.split("=", 1) for item in args.servers)}
    with tempfile.TemporaryDirectory(prefix="first-answer-") as workdir:
        result = run(servers, args.runs, Path(workdir))
    first = next(iter(servers))
    print(f"load {result['load_at_start']:.1f} -> {result['load_at_end']:.1f}; medians of "
          f"{args.runs} rounds in turns (ratios: the median of the rounds' ratios to {first})")
    for name, row in result["rows"].items():
        print(f"{name:<10} wall {row['median_ms']:8.1f} ms x{row[f'ratio_to_{first}']:.3f}   "
              f"cpu {row['median_cpu_ms']:7.1f} ms x{row[f'cpu_ratio_to_{first}']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
