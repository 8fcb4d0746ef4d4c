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


def first_answer_s(argv: list[str], home: Path) -> float:
    """Seconds from the spawn to the answer's line on stdout."""
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
        if b'"id":1' not in line.replace(b" ", b""):
            raise RuntimeError(f"{argv}: not an answer to initialize: {line[:200]!r}")
        return elapsed
    finally:
        server.kill()
        server.wait()


def run(servers: dict[str, list[str]], runs: int, workdir: Path) -> dict[str, Any]:
    names = list(servers)
    samples: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs + 1):
        this_round = {name: first_answer_s(argv, workdir / f"{name}-{i}")
                      for name, argv in servers.items()}
        if i:
            for name in names:
                samples[name].append(this_round[name])
                ratios[name].append(this_round[name] / this_round[names[0]])
    return {"runs": runs, "load_at_start": os.getloadavg()[0],
            "rows": {name: {"median_ms": 1000 * statistics.median(samples[name]),
                            f"ratio_to_{names[0]}": statistics.median(ratios[name])}
                     for name in names},
            "raw": samples}


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
    print(f"load {result['load_at_start']:.1f}; medians of {args.runs} rounds in turns")
    for name, row in result["rows"].items():
        print(f"{name:<10} {row['median_ms']:8.1f} ms   x{row[f'ratio_to_{first}']:.3f} "
              f"(median of the rounds' ratios to {first})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
