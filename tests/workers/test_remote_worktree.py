"""A worktree job on another host (issue 42): the laptop submits from its checkout, the
worker makes the worktree from its own checkout at the laptop's commit (fetched from their
common origin: the worker's clone predates it), and the changes come back as a patch in the
store that `apply` puts into the laptop's checkout; the worker then removes its worktree.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway.jobs.placement import live_hosts
from gateway.store.base import JobStore
from tests.waiting import wait_for
from tests.workers.hosts import Host, need_namespaces, observer, structured

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TEST_TIMEOUT_S = 150.0
READY_TIMEOUT_S = 60.0  # a cold `python -m gateway worker` on a loaded 2-core box
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
          "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def git(where: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ID})
    return done.stdout.strip()


@pytest.fixture
def checkouts(tmp_path: Path) -> dict[str, Path]:
    """An origin, the worker's clone of it, then a commit the laptop pushes after: the
    worker must fetch the laptop's base commit."""
    seed, origin = tmp_path / "seed", tmp_path / "origin.git"
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    (seed / "README.md").write_text("hello\n")
    (seed / "logo.bin").write_bytes(bytes(range(256)))
    git(seed, "add", ".")
    git(seed, "commit", "-q", "-m", "init")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(origin))
    worker, laptop = tmp_path / "buildbox-checkout", tmp_path / "laptop-checkout"
    git(tmp_path, "clone", "-q", str(origin), str(worker))
    git(tmp_path, "clone", "-q", str(origin), str(laptop))
    (laptop / "README.md").write_text("hello\nfrom the laptop\n")
    git(laptop, "commit", "-q", "-am", "laptop's work")
    git(laptop, "push", "-q", "origin", "main")
    return {"worker": worker, "laptop": laptop, "origin": origin}


# A lease that outlives a worker's restart: its runs are adopted, not orphaned.
RESTART_LEASE = {"heartbeat_s": 0.3, "ttl_s": 30.0, "http_job_grace_s": 30.0,
                 "sweep_interval_s": 0.3, "instance_gc_s": 30.0, "cancel_poll_s": 0.3}


@pytest.fixture
def lease() -> dict[str, Any]:
    """What the hosts' [lease] sections change of FAST_LEASE (a test parametrizes it)."""
    return {}


@pytest.fixture
def hosts(tmp_path: Path, postgres_dsn: str, checkouts: dict[str, Path],
          lease: dict[str, Any]) -> Iterator[dict[str, Host]]:
    """The laptop and the buildbox."""
    need_namespaces()
    made = {
        "laptop": Host(tmp_path, "laptop", postgres_dsn, ("claude",), lease=lease),
        "buildbox": Host(tmp_path, "buildbox", postgres_dsn, ("codex",),
                         worker={"repos": {"proj": str(checkouts["worker"])}}, lease=lease),
    }
    try:
        yield made
    finally:
        for host in made.values():
            host.stop()


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    data = structured(result)
    assert not result.is_error, data
    return data


async def worker_holds(store: JobStore, origin: str) -> bool:
    hosts = live_hosts(await store.list_instances(), await store.now())
    return any(h.hostname == "buildbox" and origin in h.repos for h in hosts)


async def ended(client: Client, job_id: str) -> dict[str, Any]:
    """The job once it has ended (llm_job_wait, called again while it has not)."""
    while True:
        done = await call(client, "llm_job_wait", job_id=job_id, timeout_s=45)
        if done["status"] not in ("queued", "running"):
            return done


def worktrees(checkout: Path) -> int:
    return git(checkout, "worktree", "list", "--porcelain").count("worktree ")


async def test_a_worktree_job_on_the_worker_comes_back_as_a_patch_apply_puts_here(
        hosts: dict[str, Host], checkouts: dict[str, Path], postgres_dsn: str,
        tmp_path: Path) -> None:
    laptop, buildbox = hosts["laptop"], hosts["buildbox"]
    mine = checkouts["laptop"]
    base = git(mine, "rev-parse", "HEAD")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            buildbox.start_worker()
            try:
                await wait_for(lambda: worker_holds(store, str(checkouts["origin"])),
                               timeout=READY_TIMEOUT_S, step=0.1)
            except TimeoutError:
                raise AssertionError(f"worker never published its repo: "
                                     f"{buildbox.stderr()}") from None
            async with laptop.client() as client:
                await call(client, "gateway_status")  # the worker's codex tools listed now
                started = await call(client, "codex_request_async",
                                     prompt="edit @write=notes.txt,README.md",
                                     working_dir=str(mine), isolation="worktree",
                                     runs_on="any")
                job_id = started["job_id"]
                done = await ended(client, job_id)
                assert done["status"] == "completed", (done, buildbox.stderr())
                stat = await call(client, "llm_job_changes", job_id=job_id)
                assert "notes.txt" in stat["diff"] and "README.md" in stat["diff"], stat
                patch = await call(client, "llm_job_changes", job_id=job_id,
                                   format="patch")
                shell = subprocess.run(laptop.argv("jobs", "diff", "--stat", job_id),
                                       env=laptop.env(), capture_output=True, text=True,
                                       timeout=60, check=False)
                assert shell.returncode == 0 and "notes.txt" in shell.stdout, shell
                assert "+++ b/notes.txt" in patch["diff"], patch
                (mine / "notes.txt").write_text("mine\n")  # a clash: refused, nothing done
                refused = await client.call_tool(
                    "llm_job_changes", {"job_id": job_id, "action": "apply"})
                assert refused.is_error and "notes.txt" in str(structured(refused))
                assert git(mine, "diff", "--stat") == ""
                (mine / "notes.txt").unlink()
                applied = await call(client, "llm_job_changes", job_id=job_id,
                                     action="apply")
            patch_row = await store.get_patch(job_id)
            # The worker serves the removal request on its loop: its worktree goes.
            await wait_for(lambda: worktrees(checkouts["worker"]) == 1, timeout=30, step=0.1)
    assert sorted(applied["files"]) == ["README.md", "notes.txt"], applied
    assert applied["worktree_host"] == "buildbox"
    assert "written by fake-codex" in (mine / "notes.txt").read_text()
    assert (mine / "README.md").read_text().startswith("hello\nfrom the laptop\n")
    assert git(mine, "rev-parse", "HEAD") == base  # uncommitted edits, on the laptop's HEAD
    assert patch_row is not None and patch_row.base_sha == base
    assert patch_row.hostname == "buildbox" and patch_row.discard_requested
    assert [s["prompt"] for s in buildbox.spawns()] == ["edit @write=notes.txt,README.md"]
    assert laptop.spawns() == []


@pytest.mark.parametrize("lease", [RESTART_LEASE])
async def test_a_worker_killed_mid_run_of_a_worktree_job_stores_its_patch_once_restarted(
        hosts: dict[str, Host], checkouts: dict[str, Path], postgres_dsn: str,
        tmp_path: Path) -> None:
    """The worker writes the plan it made at the claim into the row before the run starts:
    the worker started again on its host adopts the run, commits the worktree and stores
    the patch, which `apply` puts into the laptop's checkout."""
    laptop, buildbox = hosts["laptop"], hosts["buildbox"]
    mine = checkouts["laptop"]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            buildbox.start_worker()
            await wait_for(lambda: worker_holds(store, str(checkouts["origin"])),
                           timeout=READY_TIMEOUT_S, step=0.1)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                started = await call(client, "codex_request_async",
                                     prompt="slow edit @sleep=3 @write=notes.txt",
                                     working_dir=str(mine), isolation="worktree",
                                     runs_on="any")
                job_id = started["job_id"]
                await wait_for(buildbox.spawns, timeout=60, step=0.05)
                row = await store.get_job(job_id, with_output=False)
                assert row is not None and '"worktree"' in (row.request_json or ""), row
                buildbox.signal(signal.SIGKILL)  # mid-run: the run goes on, its worker not
                assert buildbox.process is not None
                buildbox.process.wait(10)
                buildbox.start_worker()  # the same host again: adopts the run
                done = await ended(client, job_id)
                assert done["status"] == "completed", (done, buildbox.stderr())
                applied = await call(client, "llm_job_changes", job_id=job_id,
                                     action="apply")
            patch_row = await store.get_patch(job_id)
    assert patch_row is not None and patch_row.patch is not None, buildbox.stderr()
    assert applied["files"] == ["notes.txt"], applied
    assert "written by fake-codex" in (mine / "notes.txt").read_text()
    assert [s["prompt"] for s in buildbox.spawns()] == ["slow edit @sleep=3 @write=notes.txt"]
