"""`agent-cli-gateway attempts run` (issue 39): the command line starts a group through its own
gateway, follows it (a progress line on stderr), prints the comparison table and exits 0 when
a winner exists, 1 when none; a bad `--check` or `--target` is a usage error (2). Real
processes, a real repository with a failing test, the fake agents of test_attempts_mcp.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.mcp.conftest import own_harness
from tests.mcp.test_attempts_mcp import check_runs, cli, git, group_args, scratch_repo

pytestmark = [pytest.mark.slow]


def run_args(repo: Path, root: Path, *targets: str) -> list[str]:
    args = group_args(repo, root)  # writes agent.py; its check argv is the one we quote
    check = " ".join(shlex.quote(arg) for arg in args["check"])
    argv = ["attempts", "run", args["prompt"], "--check", check, "--working-dir", str(repo)]
    for target in targets:
        argv += ["--target", target]
    return argv


def test_attempts_run_prints_the_comparison_and_exits_0_with_a_winner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        done = cli(harness.home, config, *run_args(repo, tmp_path, "claude", "codex", "gemini"))
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("group ") and ": done (base " in lines[0]
        ranks = [line.split()[0] for line in lines[1:4]]
        assert ranks == ["1", "3", "4"]
        assert "claude" in lines[1] and "check passed" in lines[1]
        assert "codex" in lines[2] and "check failed (1)" in lines[2]
        assert lines[-1].startswith("winner: ") and "check passed" in lines[-1]
        assert "3 attempts" in done.stderr and "ended after" in done.stderr
        assert len(check_runs(tmp_path)) == 2
        # The group is the store's like any other: `attempts show` reads the same one.
        group = lines[0].split()[1].rstrip(":")
        shown = cli(harness.home, config, "attempts", "show", group)
        assert shown.returncode == 0 and shown.stdout.strip() == done.stdout.strip()


def test_attempts_run_exits_1_when_no_attempt_qualifies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        argv = [*run_args(repo, tmp_path, "gemini"), "-n", "2"]  # gemini changes nothing
        done = cli(harness.home, config, *argv)
        assert done.returncode == 1, done.stderr
        assert done.stdout.splitlines()[-1] == "winner: none"
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize(("extra", "said"), [
    (["--check", "'unclosed"], "--check cannot be split"),
    (["--check", ""], "--check is empty"),
    (["--target", "-x"], "--target must be PROVIDER"),
    (["--until", "first-passing"], "needs a check"),
])
def test_attempts_run_refuses_bad_input_with_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], said: str) -> None:
    repo = scratch_repo(tmp_path)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        config = harness.write_config({})
        argv = ["attempts", "run", "fix add", "--working-dir", str(repo),
                "--target", "claude", "--target", "codex", *extra]
        if extra[0] == "--target":  # an option value never becomes a flag: pass it glued
            argv = [*argv[:-2], f"--target={extra[1]}"]
        done = cli(harness.home, config, *argv)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert said in done.stderr
    assert git(repo, "branch").split() == ["*", "main"]  # nothing admitted
