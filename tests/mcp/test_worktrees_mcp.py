"""Isolated jobs through a real MCP client session over stdio (issue #27), and the same job's
changes through the command line: diffable, appliable, discardable, on a real git repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import REPO, own_harness, server_env, stdio_client
from tests.mcp.test_tools import succeed, wait_done
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 90.0
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
          "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ID}).stdout


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "init")
    return path


def cli(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=REPO, text=True,
                          capture_output=True, env=server_env(home, config), timeout=scaled(60))


async def isolated_job(client: Any, repo: Path, prompt: str) -> dict[str, Any]:
    started = await succeed(client, "claude_request_async", {
        "prompt": prompt, "working_dir": str(repo), "isolation": "worktree"})
    assert started["worktree"]["changed"] is None  # planned, not yet ended
    return await wait_done(client, started["job_id"])


async def test_an_isolated_jobs_changes_through_mcp_and_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "checkout")
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with stdio_client(harness.home, config, "legacy") as client:
                one = await isolated_job(client, repo, "one @write=README.md,new.txt")
                two = await isolated_job(client, repo, "two @write=other.txt")
                three = await isolated_job(client, repo, "three @write=third.txt")
                for done in (one, two, three):
                    assert done["status"] == "completed"
                status = await succeed(client, "llm_job_status", {"job_id": one["job_id"]})
                tree = status["worktree"]
                assert tree["changed"] is True and tree["files_changed"] == 2
                assert set(tree) >= {"path", "branch", "base_sha", "changed", "files_changed",
                                     "insertions", "deletions"}
                stat = await succeed(client, "llm_job_changes", {"job_id": one["job_id"]})
                assert "README.md" in stat["diff"] and "new.txt" in stat["diff"]
                page = await succeed(client, "llm_job_changes", {
                    "job_id": one["job_id"], "format": "patch", "max_bytes": 50})
                assert page["next_offset"] == 50 and page["next"]["tool"] == "llm_job_changes"
                (repo / "README.md").write_text("mine\n")  # the checkout changed the same file
                refused = await client.call_tool("llm_job_changes", {
                    "job_id": one["job_id"], "action": "apply"})
                assert refused.is_error and refused.structured_content is not None
                assert refused.structured_content["error_kind"] == "invalid_input"
                assert (repo / "README.md").read_text() == "mine\n"
                git(repo, "checkout", "--", "README.md")
                applied = await succeed(client, "llm_job_changes", {
                    "job_id": one["job_id"], "action": "apply"})
                assert sorted(applied["files"]) == ["README.md", "new.txt"]
                assert "fake-claude" in (repo / "new.txt").read_text()
                discarded = await succeed(client, "llm_job_changes", {
                    "job_id": two["job_id"], "action": "discard"})
                assert discarded["branch"] not in git(repo, "branch")
                # #27: status and result say what became of each worktree, path null
                for job, state in ((one, "applied"), (two, "discarded"), (three, "kept")):
                    for tool in ("llm_job_status", "llm_job_result"):
                        tree = (await succeed(client, tool, {"job_id": job["job_id"]}))[
                            "worktree"]
                        assert tree["state"] == state, (tool, tree)
                        assert (tree["path"] is None) == (state != "kept"), (tool, tree)
        # the command line, on the third job
        short = three["job_id"][:8]
        diff = cli(harness.home, config, "jobs", "diff", short, "--stat")
        assert diff.returncode == 0 and "third.txt" in diff.stdout, diff.stderr
        patch = cli(harness.home, config, "jobs", "diff", short)
        assert "+written by fake-claude" in patch.stdout
        listed = cli(harness.home, config, "worktrees", "--json")
        assert listed.returncode == 0 and three["job_id"] in listed.stdout, listed.stderr
        before = json.loads(cli(harness.home, config, "jobs", "show", short, "--json").stdout)
        assert before["worktree"]["state"] == "kept" and before["worktree"]["path"]
        applied_cli = cli(harness.home, config, "jobs", "apply", short)
        assert applied_cli.returncode == 0, applied_cli.stderr
        assert (repo / "third.txt").exists()
        shown = cli(harness.home, config, "jobs", "show", short, "--json")
        assert shown.returncode == 0, shown.stderr
        after = json.loads(shown.stdout)["worktree"]
        assert (after["state"], after["path"]) == ("applied", None)
        text = cli(harness.home, config, "jobs", "show", short).stdout
        assert f"applied: branch {after['branch']}" in text
        again = cli(harness.home, config, "jobs", "discard", short)
        assert again.returncode != 0 and "applied already" in again.stderr
        assert git(repo, "branch").split() == ["*", "main"]
