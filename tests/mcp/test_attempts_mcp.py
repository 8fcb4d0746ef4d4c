"""Attempt groups end to end (issue 39): real MCP sessions over stdio, a real git repository
with a failing test, fake agents (a correct fix, a wrong one, nothing) and a real check run
in each attempt's worktree, on SQLite and PostgreSQL.

The agents differ by provider: one prompt goes to every attempt, and the prompt's
`@script=` runs agent.py, which acts by the fake binary that runs it. The check (check.py,
committed in the repository) appends a line to a count log each time it runs, so "ran
exactly once" is counted, not assumed; given a gate file it waits for it, so a test can kill
the gateway while a check runs.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import REPO, own_harness, server_env, stdio_client
from tests.mcp.test_tools import succeed
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TEST_TIMEOUT_S = 150.0
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
          "GIT_COMMITTER_EMAIL": "t@t"}
WAIT_LIMIT_S = 90.0

AGENT = '''
import os, sys
who = os.path.basename(sys.orig_argv[1])
if who == "claude":
    open("calc.py", "w").write("def add(a, b):\\n    return a + b\\n")
elif who == "codex":
    open("calc.py", "w").write("def add(a, b):\\n    return a * b\\n")
'''

CHECK = '''
import os, sys, time
with open(sys.argv[1], "a") as log:
    log.write(os.getcwd() + "\\n")
if len(sys.argv) > 2:
    deadline = time.time() + 120
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.02)
sys.path.insert(0, os.getcwd())
from calc import add
print("add(2, 3) =", add(2, 3))
sys.exit(0 if add(2, 3) == 5 else 1)
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ID}).stdout


def scratch_repo(root: Path) -> Path:
    """A repository whose test fails: add() subtracts."""
    repo = root / "checkout"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "check.py").write_text(CHECK)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    return repo


def group_args(repo: Path, root: Path, *, gate: Path | None = None,
               **changes: Any) -> dict[str, Any]:
    agent = root / "agent.py"
    agent.write_text(AGENT)
    check = [sys.executable, "check.py", str(root / "checks.log")]
    if gate is not None:
        check.append(str(gate))
    return {"prompt": f"fix add @script={agent}", "working_dir": str(repo), "check": check,
            "targets": [{"provider": "claude"}, {"provider": "codex"}, {"provider": "gemini"}],
            **changes}


def cli(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=REPO, text=True,
                          capture_output=True, env=server_env(home, config), timeout=60)


def check_runs(root: Path) -> list[str]:
    log = root / "checks.log"
    return log.read_text().splitlines() if log.exists() else []


async def comparison(client: Any, group_id: str) -> dict[str, Any]:
    """llm_attempts_status with wait_s until the group is done."""
    with anyio.fail_after(WAIT_LIMIT_S):
        while True:
            data = await succeed(client, "llm_attempts_status",
                                 {"group_id": group_id, "wait_s": 20})
            if data["done"]:
                return data


def by_provider(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["provider"]: row for row in data["attempts"]}


@pytest.mark.usefixtures("platform_impl")  # the run lifecycle of both platforms
async def test_three_agents_rank_one_three_four_and_apply_keeps_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_config: dict[str, Any]) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config(store_config)
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as client:
                started = await succeed(client, "llm_attempts", group_args(repo, tmp_path))
                assert started["status"] == "running" and len(started["attempts"]) == 3
                assert started["next"]["tool"] == "llm_attempts_status"
                again = await succeed(client, "llm_attempts", group_args(repo, tmp_path))
                assert again["group_id"] == started["group_id"] and again["deduplicated"]
                data = await comparison(client, started["group_id"])
                rows = by_provider(data)
                assert [row["provider"] for row in data["attempts"]] == [
                    "claude", "codex", "gemini"]
                assert [row["rank"] for row in data["attempts"]] == [1, 3, 4]
                assert data["status"] == "done" and data["base_sha"] == git(
                    repo, "rev-parse", "HEAD").strip()
                assert data["winner"]["job_id"] == rows["claude"]["job_id"]
                assert "check passed" in data["winner"]["reason"]
                right, wrong, idle = rows["claude"], rows["codex"], rows["gemini"]
                assert right["check"]["passed"] and right["check"]["exit_code"] == 0
                assert "add(2, 3) = 5" in right["check"]["output_tail"]
                assert wrong["check"]["exit_code"] == 1 and not wrong["check"]["passed"]
                assert idle["check"] is None and idle["check_skipped"] == "no_changes"
                assert right["changes"]["files"] == ["calc.py"]
                assert right["changes"]["applies_cleanly"] is True
                assert right["changes"]["insertions"] == 1 and right["changes"]["deletions"] == 1
                assert idle["changes"]["files_changed"] == 0
                assert len(check_runs(tmp_path)) == 2  # one per attempt with changes
                picked = await succeed(client, "llm_attempts_pick", {
                    "group_id": started["group_id"], "job_id": right["job_id"]})
                assert picked["status"] == "picked"
                assert "a + b" in (repo / "calc.py").read_text()
                assert git(repo, "branch").split() == ["*", "main"]  # every branch removed
                assert git(repo, "worktree", "list").count("\n") == 1
                after = await succeed(client, "llm_attempts_status",
                                      {"group_id": started["group_id"]})
                assert after["status"] == "picked"
                assert after["winner"]["job_id"] == right["job_id"]


@pytest.mark.usefixtures("platform_impl")  # the run lifecycle of both platforms
async def test_first_passing_cancels_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    never = tmp_path / "never"  # codex's attempt waits for it: it runs until cancelled
    args = group_args(repo, tmp_path, until="first_passing")
    args["targets"] = [{"provider": "claude"}, {"provider": "codex"}]
    (tmp_path / "agent.py").write_text(AGENT.replace(
        'elif who == "codex":\n',
        f'elif who == "codex":\n    import time\n'
        f'    while not os.path.exists({str(never)!r}):\n        time.sleep(0.02)\n'))
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as client:
                started = await succeed(client, "llm_attempts", args)
                data = await comparison(client, started["group_id"])
    assert data["status"] == "done"
    rows = by_provider(data)
    assert (rows["claude"]["rank"], rows["codex"]["rank"]) == (1, 5)
    assert data["winner"]["job_id"] == rows["claude"]["job_id"]
    assert rows["codex"]["status"] == "cancelled"
    assert len(check_runs(tmp_path)) == 1
    branches = git(repo, "branch")
    assert rows["claude"]["changes"]["branch"] in branches
    assert branches.count("agent-gateway/") == 1  # the cancelled attempt's was discarded


async def test_a_gateway_killed_during_a_check_leaves_each_check_run_once_and_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    gate = tmp_path / "gate"
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as client:
                started = await succeed(client, "llm_attempts",
                                        group_args(repo, tmp_path, gate=gate))
                status = await succeed(client, "gateway_status", {})
                instance = status["instance_id"]
                # Both checks started (they wait on the gate): kill the gateway mid-check.
                await wait_for(lambda: len(check_runs(tmp_path)) == 2, WAIT_LIMIT_S)
                pid = gateway_pid(harness, instance)
                os.kill(pid, signal.SIGKILL)
                with pytest.raises(Exception):  # noqa: B017 - the session's server is gone
                    await succeed(client, "gateway_status", {})
            gate.touch()  # the checks end with no gateway alive
            async with stdio_client(harness.home, config, "legacy") as client:
                data = await comparison(client, started["group_id"])
    assert [row["rank"] for row in data["attempts"]] == [1, 3, 4]
    assert len(check_runs(tmp_path)) == 2  # each ran exactly once
    rows = by_provider(data)
    assert rows["claude"]["check"]["exit_code"] == 0
    assert rows["codex"]["check"]["exit_code"] == 1


async def test_a_window_closed_right_after_llm_attempts_still_completes_every_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as client:
                started = await succeed(client, "llm_attempts", group_args(repo, tmp_path))
            async with stdio_client(harness.home, config, "legacy") as client:
                data = await comparison(client, started["group_id"])
        assert [row["rank"] for row in data["attempts"]] == [1, 3, 4]
        assert len(check_runs(tmp_path)) == 2
        # The command line reads the same comparison and picks through the same code.
        group = started["group_id"]
        shown = cli(harness.home, config, "attempts", "show", group, "--json")
        assert shown.returncode == 0, shown.stderr
        assert [row["rank"] for row in json.loads(shown.stdout)["attempts"]] == [1, 3, 4]
        table = cli(harness.home, config, "attempts", "show", group)
        assert "check passed" in table.stdout and "winner:" in table.stdout
        assert group in cli(harness.home, config, "attempts", "list").stdout
        refused = cli(harness.home, config, "attempts", "pick", group)
        assert refused.returncode == 2 and "needs JOB" in refused.stderr
        discarded = cli(harness.home, config, "attempts", "pick", group, "--discard")
        assert discarded.returncode == 0, discarded.stderr
        assert "discarded" in discarded.stdout
        assert git(repo, "branch").split() == ["*", "main"]


async def test_a_budget_that_fits_two_of_three_attempts_refuses_the_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({"budgets": {"providers": {
            "claude": {"max_jobs_per_day": 2}}}})
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as client:
                args = group_args(repo, tmp_path)
                args["targets"] = [{"provider": "claude", "count": 3}]
                refused = await client.call_tool("llm_attempts", args)
                assert refused.is_error and refused.structured_content is not None
                assert refused.structured_content["error_kind"] == "budget_exceeded"
                jobs = await succeed(client, "llm_job_list", {})
                assert jobs["count"] == 0  # nothing admitted
    assert git(repo, "branch").split() == ["*", "main"]


def gateway_pid(harness: Any, instance_id: str) -> int:
    """The pid of the gateway instance `instance_id`, from its store row."""
    db = sorted((harness.root / "state").glob("jobs-*.db"))[-1]
    with sqlite3.connect(db) as conn:
        (pid,) = conn.execute("SELECT pid FROM gateway_instances WHERE instance_id = ?",
                              (instance_id,)).fetchone()
    return int(pid)


async def test_ten_identical_calls_on_two_gateways_make_one_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_config: dict[str, Any]) -> None:
    repo = scratch_repo(tmp_path)
    args = group_args(repo, tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config(store_config)
        groups: list[str] = []
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, config, "legacy") as one, \
                    stdio_client(harness.home, config, "legacy") as two:

                async def call(client: Any) -> None:
                    groups.append((await succeed(client, "llm_attempts", args))["group_id"])

                async with anyio.create_task_group() as tg:
                    for i in range(10):
                        tg.start_soon(call, (one, two)[i % 2])
                assert len(groups) == 10 and len(set(groups)) == 1
                listed = await succeed(one, "llm_job_list", {})
                assert listed["count"] == 3  # one group's three attempts, nothing else
                await comparison(one, groups[0])
