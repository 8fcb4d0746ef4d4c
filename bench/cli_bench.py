"""The operator's read commands, timed side by side (issue #45 item 1: `jobs list`, `jobs
show`, `usage` under 250 ms on a quiet box).

Each command runs as the console entry (`python -m gateway ...`) against one SQLite store
of SEED_JOBS finished jobs, in turns with its floors (ABAB, the median of `--runs`):

- `python -c pass`: the interpreter's own start;
- the configuration floor: importing `gateway.config` and loading the file through
  pydantic-settings (which the CLI must use): what no read command can go below;
- with `--before <checkout>`: the same commands from another checkout (e.g. main), to
  show what a change did in the same run.

On a user install when uv is there (bench/run.py `user_install`: the locked runtime
dependencies, no dev group), so `rich`, which the dev group brings and structlog imports
when present, is not counted. Bytecode is compiled first: a start must not pay for it
(PYTHONDONTWRITEBYTECODE is unset for the children).

    uv run python bench/cli_bench.py
    uv run python bench/cli_bench.py --before ../main --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import user_install  # noqa: E402
from gateway.config import load_settings  # noqa: E402
from gateway.model import Completion, InstanceRow, JobStatus, NewJob  # noqa: E402
from gateway.store import open_store  # noqa: E402

SEED_JOBS = 30
OWNER = "instance-cli-bench"
FIRST = "bbbb0000-0000-4000-8000-000000000000"
TARGET_MS = 250.0  # the bound for a read command on a quiet box
CONFIG_FLOOR = ("import sys; from pathlib import Path; from gateway.config import load_settings; "
                "load_settings(Path(sys.argv[1]))")


def _job_id(n: int) -> str:
    return f"bbbb{n:04d}" + FIRST[8:]


async def _seed(config: Path) -> None:
    store = await open_store(load_settings(config))
    try:
        await store.register_instance(InstanceRow(
            instance_id=OWNER, hostname="elsewhere", boot_id="b", pid=1, pid_started_at=None,
            role="stdio", version="bench"), ttl_s=3600)
        for n in range(SEED_JOBS):
            job_id = _job_id(n)
            request: dict[str, Any] = {"provider": "claude", "prompt": f"bench job {n}",
                                       "model": None, "options": {}}
            await store.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                          owner_instance=OWNER, hostname="elsewhere",
                                          request_json=json.dumps(request)), ttl_s=3600)
            await store.mark_running(job_id, OWNER, ttl_s=3600)
            await store.complete(job_id, OWNER, Completion(
                status=JobStatus.COMPLETED, exit_code=0, output="{}", output_bytes=2,
                result_json=json.dumps({"text": "an answer", "session_id": "s"})))
    finally:
        await store.close()


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one run; a failed run stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed: {done.stderr.decode(errors='replace')}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def run(runs: int, before: Path | None, workdir: Path) -> dict[str, Any]:
    python, described = user_install(workdir)
    home = workdir / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    config = home / "config.toml"
    config.write_text(f'[persistence]\npath = "{home / "jobs.db"}"\n')
    config.chmod(0o600)
    asyncio.run(_seed(config))
    trees = {"this": ROOT, **({"before": before.resolve()} if before else {})}
    for tree in trees.values():
        for package in ("gateway", "providers", "neutral"):
            compileall.compile_dir(tree / package, quiet=1)
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONDONTWRITEBYTECODE", "AGENT_GATEWAY_CONFIG")}
    base_env["HOME"] = str(home)
    commands = {"jobs list": ["jobs", "list"], "jobs show": ["jobs", "show", _job_id(7)[:8]],
                "usage": ["usage"], "--version": ["--version"]}
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass": ([python, "-c", "pass"], base_env),
        "config floor": ([python, "-c", CONFIG_FLOOR, str(config)],
                         {**base_env, "PYTHONPATH": str(ROOT)}),
    }
    for tree_name, tree in trees.items():
        for name, args in commands.items():
            extra = [] if args == ["--version"] else ["--config", str(config)]
            cases[f"{name} ({tree_name})"] = ([python, "-m", "gateway", *args, *extra],
                                              {**base_env, "PYTHONPATH": str(tree)})
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(runs + 1):  # the first round warms the page cache, untimed
        for name, (argv, env) in cases.items():
            wall, cpu = _timed(argv, env)
            if i:
                walls[name].append(wall)
                cpus[name].append(cpu)
    floor = statistics.median(walls["config floor"])
    rows = {name: {"wall_ms": 1000 * statistics.median(walls[name]),
                   "cpu_ms": 1000 * statistics.median(cpus[name]),
                   "vs_config_floor": statistics.median(walls[name]) / floor}
            for name in cases}
    return {"python": described, "runs": runs, "load_at_start": os.getloadavg()[0],
            "rows": rows, "raw": {"walls": walls, "cpus": cpus}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--before", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as workdir:
        result = run(args.runs, args.before, Path(workdir))
    print(f"{result['python']}; load {result['load_at_start']:.1f}; medians of "
          f"{args.runs} rounds in turns")
    print(f"{'command':<24} {'wall ms':>8} {'cpu ms':>8} {'x config floor':>15}")
    for name, row in result["rows"].items():
        print(f"{name:<24} {row['wall_ms']:8.1f} {row['cpu_ms']:8.1f} "
              f"{row['vs_config_floor']:15.2f}")
    print(f"(target: a read command under {TARGET_MS:.0f} ms on a quiet box)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
