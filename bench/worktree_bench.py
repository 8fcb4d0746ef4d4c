"""Worktree creation (issue #27): the gateway's create_worktree on a repository of N files
against plain `git worktree add` of the same commit, interleaved. Runnable alone:
`uv run python bench/worktree_bench.py [FILES] [SAMPLES]`.

Each sample makes one worktree and removes it again (remove is not timed): the gateway's
path is the whole of creation (the lock, `worktree add --no-checkout --no-track`, the
hook-less checkout, the verification and `worktree lock`); the floor is what git itself needs
to add and check out the same tree.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.config import load_settings  # noqa: E402
from gateway.jobs.worktrees.create import (  # noqa: E402
    create_worktree,
    inspect_repository,
    plan_worktree,
    remove_worktree,
)

FILES_PER_DIR = 100  # a source tree's shape rather than one flat directory
GIT_ID = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
          "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, **GIT_ID})


def make_repo(path: Path, files: int) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    for n in range(files):
        folder = path / f"pkg{n // FILES_PER_DIR:03d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{n:05d}.py").write_text(f"VALUE = {n}\n" + "# filler\n" * 20)
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "bench tree")
    return path


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def run_worktree_bench(workdir: Path, files: int = 10_000, samples: int = 20) -> dict[str, Any]:
    repo = make_repo(workdir / "repo", files)
    settings = load_settings(persistence={"backend": "sqlite",
                                          "path": str(workdir / "state" / "jobs.db")})
    found = inspect_repository(str(repo), None)
    gateway_s: list[float] = []
    plain_s: list[float] = []
    for _ in range(samples):
        job_id = str(uuid.uuid4())
        plan = plan_worktree(settings, found, None, job_id, "bench")
        t0 = time.perf_counter()
        create_worktree(settings, plan)
        gateway_s.append(time.perf_counter() - t0)
        remove_worktree(plan)
        Path(plan.path + ".json").unlink(missing_ok=True)
        plain = workdir / f"plain-{job_id[:8]}"
        t0 = time.perf_counter()
        _git(repo, "worktree", "add", "-q", "--detach", str(plain), found.base_sha)
        plain_s.append(time.perf_counter() - t0)
        _git(repo, "worktree", "remove", "--force", str(plain))
    return {"files": files, "samples": samples,
            "gateway_p50_s": statistics.median(gateway_s), "gateway_p95_s": _pct(gateway_s, 95),
            "plain_p50_s": statistics.median(plain_s), "plain_p95_s": _pct(plain_s, 95),
            "gateway_s": gateway_s, "plain_s": plain_s}


if __name__ == "__main__":
    import tempfile

    files = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    samples = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with tempfile.TemporaryDirectory(prefix="acg-wt-bench-") as tmp:
        result = run_worktree_bench(Path(tmp), files, samples)
    print({k: v for k, v in result.items() if not k.endswith("_s") or "p" in k})
