"""Attempt groups (issue 39): admission of a group of 4 fake attempts on a 2,000-file
repository, and how soon its comparison is complete once the last attempt ended.

Each round admits one group through `submit_group` (what `llm_attempts` calls) on an
in-process gateway (SQLite), four fake claude attempts that each write one file and then
wait on a gate file (the fake CLI's `@until=`), with a check (`python -c pass`: a real
process in each worktree, the cheapest one). Two numbers per round:

- admission: from the call until all 4 worktrees are made (each attempt's CLI has started
  in its worktree: the fake logs its start, so this includes 4 process starts), target
  p95 <= 4 s (worktree_bench.py's 2 s for one worktree on 10,000 files, for four on 2,000
  made at once by one gateway);
- end -> complete: the gate is opened; from the last attempt's `finished_at` (its
  supervisor's end record) until `comparison()` (what `llm_attempts_status` answers) says
  `done` with every row's check recorded, target p95 <= 2 s (the coordinator's 0.25 s busy
  tick, four checks, the ranking's git reads).

    uv run python bench/bench_attempts.py --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.config import load_settings
from gateway.jobs.attempts.admit import AttemptTarget, GroupRequest, submit_group
from gateway.jobs.attempts.comparison import comparison
from gateway.jobs.attempts.pick import pick
from gateway.runtime import Gateway
from tests.jobs.conftest import FAKE_COMMANDS, FAKES_BIN, FAST_LEASE

ADMISSION_TARGET_S = 4.0
COMPLETE_TARGET_S = 2.0
ATTEMPTS = 4
POLL_S = 0.01
BOUND_S = 120.0
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b"}


def make_repo(root: Path, files: int) -> Path:
    """A repository of `files` small files, 100 per directory, one commit."""
    repo = root / "repo"
    repo.mkdir()
    for n in range(files):
        directory = repo / f"d{n // 100:03d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{n:05d}.py").write_text(f"VALUE = {n}\n")
    env = {**os.environ, **GIT_ENV}
    for argv in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env)
    return repo


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not await predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {BOUND_S:g} s: {what}")
        await asyncio.sleep(POLL_S)


async def one_round(gateway: Gateway, repo: Path, workdir: Path, n: int) -> tuple[float, float]:
    manager = await gateway.manager()
    store = manager.store
    gate = workdir / f"gate-{n}"
    request = GroupRequest(
        prompt=f"bench attempts round {n} @write=out-{n}.txt @until={gate}",
        targets=[AttemptTarget("claude", count=ATTEMPTS)], working_dir=str(repo),
        check=[sys.executable, "-c", "pass"])
    started = time.monotonic()
    submission = await submit_group(manager, request)
    log = workdir / "fake.log"

    async def all_made() -> bool:
        """Each attempt's CLI started, in its worktree: the fake logs its start."""
        if not log.exists():
            return False
        starts = [json.loads(line) for line in log.read_text().splitlines() if line]
        return sum(f"round {n} " in str(s.get("prompt", "")) for s in starts) >= ATTEMPTS

    await _until(all_made, "the 4 worktrees")
    admission = time.monotonic() - started
    gate.touch()
    group_id = submission.group.group_id

    async def complete() -> bool:
        group = await store.get_attempt_group(group_id)
        if group is None:
            return False
        data = await comparison(store, manager.hostname, group)
        return bool(data["done"]) and all(row["check"] is not None for row in data["attempts"])

    await _until(complete, "the group's complete comparison")
    seen = time.time()
    ended = [await store.get_job(job_id, with_output=False) for job_id in submission.job_ids]
    last = max(job.finished_at.timestamp() for job in ended
               if job is not None and job.finished_at is not None)
    group = await store.get_attempt_group(group_id)
    assert group is not None
    await pick(manager, group, None, "discard")  # untimed: worktrees back under max_per_repo
    return admission, seen - last


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.95 + 0.5) - 1)]


async def main_async(rounds: int, files: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="attempts-bench-"))
    repo = make_repo(workdir, files)
    providers = {name: {"command": str(FAKES_BIN / binary),
                        "env": {"FAKE_CLI_LOG": str(workdir / "fake.log")}}
                 for name, binary in FAKE_COMMANDS.items()}
    settings = load_settings(
        persistence={"backend": "sqlite", "path": str(workdir / "state" / "jobs.db")},
        lease=dict(FAST_LEASE), limits={"kill_grace_s": 1.0}, providers=providers,
        logging={"level": "warning"})
    gateway = Gateway(settings)
    await gateway.start()
    try:
        samples = [await one_round(gateway, repo, workdir, n) for n in range(rounds)]
    finally:
        await gateway.stop()
    admissions = [a for a, _ in samples]
    completes = [c for _, c in samples]
    return {"rounds": rounds, "files": files,
            "admission_p95_s": round(p95(admissions), 3),
            "admission_of_target": round(p95(admissions) / ADMISSION_TARGET_S, 2),
            "complete_p95_s": round(p95(completes), 3),
            "complete_of_target": round(p95(completes) / COMPLETE_TARGET_S, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--files", type=int, default=2000)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args.rounds, args.files))
    print(json.dumps(result))
    return 0 if max(result["admission_of_target"], result["complete_of_target"]) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
