"""The judge of an attempt group (issue 39) end to end: real MCP sessions, a real repository
with a failing test, fake agents, a real check, and the fake `grok` CLI as the judge.

Two claude attempts write the correct fix (class 1, tied: the deterministic order puts the
first submitted first), codex a wrong one (class 3), gemini nothing (class 4). The judge's
behaviour comes from a mode file the test writes (agent.py, run by every fake through the
prompt's `@script=`, acts as the judge when the binary is grok): it names the second claude
attempt (a valid verdict that changes the order), answers garbage, names an attempt that
does not qualify, or hangs past `[attempts] judge_timeout_s`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import own_harness, stdio_client
from tests.mcp.test_attempts_mcp import (
    AGENT,
    TEST_TIMEOUT_S,
    comparison,
    group_args,
    scratch_repo,
)
from tests.mcp.test_tools import succeed

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

JUDGE = '''
import json, re, time
if who == "grok":
    mode_file = os.path.join(os.path.dirname(__file__), "judge_mode")
    deadline = time.time() + 120
    while not os.path.exists(mode_file) and time.time() < deadline:
        time.sleep(0.02)
    mode = open(mode_file).read().strip()
    ids = re.findall(r"^## Attempt (\\S+):", fake_run.prompt, re.MULTILINE)
    with open(mode_file + ".saw", "w") as saw:  # the qualifying attempts, as ranked
        json.dump(ids, saw)
    if mode == "garbage":
        fake_run.answer = "They all look fine to me."
    elif mode == "hang":
        while time.time() < deadline and not os.path.exists(mode_file + ".never"):
            time.sleep(0.05)
    elif mode.startswith("name:"):
        fake_run.answer = json.dumps({"job_id": mode[5:], "reason": "it looked best"})
    else:
        fake_run.answer = ("Here is my verdict:\\n```json\\n"
                           + json.dumps({"job_id": ids[-1], "reason": "the clearer fix"})
                           + "\\n```")
'''


def judged_args(repo: Path, root: Path) -> dict[str, Any]:
    args = group_args(repo, root, judge={"provider": "grok"})
    (root / "agent.py").write_text(AGENT + JUDGE)
    args["targets"] = [{"provider": "claude", "count": 2}, {"provider": "codex"},
                       {"provider": "gemini"}]
    return args


async def judged_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str | None,
                       config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the group to its end; `mode` None: the mode names the gemini attempt (known only
    once the group is admitted). The answer of llm_attempts and the final comparison."""
    repo = scratch_repo(tmp_path)
    args = judged_args(repo, tmp_path)
    if mode is not None:
        (tmp_path / "judge_mode").write_text(mode)
    with own_harness("stdio-legacy", tmp_path, monkeypatch) as harness:
        path = harness.write_config(config)
        with anyio.fail_after(TEST_TIMEOUT_S):
            async with stdio_client(harness.home, path, "legacy") as client:
                started = await succeed(client, "llm_attempts", args)
                if mode is None:
                    idle = started["attempts"][3]
                    assert idle["provider"] == "gemini"
                    (tmp_path / "judge_mode").write_text(f"name:{idle['job_id']}")
                return started, await comparison(client, started["group_id"])


def judge_saw(root: Path) -> list[str]:
    """The attempts the judge was shown, in the deterministic order."""
    return list(json.loads((root / "judge_mode.saw").read_text()))


async def test_a_judge_that_names_a_qualifying_attempt_makes_it_the_winner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_config: dict[str, Any]) -> None:
    started, data = await judged_group(tmp_path, monkeypatch, "good", store_config)
    first, second = judge_saw(tmp_path)  # the judge names the second of the two
    assert {first, second} == {a["job_id"] for a in started["attempts"]
                               if a["provider"] == "claude"}
    assert data["status"] == "done"
    assert [row["job_id"] for row in data["attempts"][:2]] == [second, first]
    assert [row["rank"] for row in data["attempts"]] == [1, 1, 3, 4]
    assert data["winner"]["job_id"] == second
    assert data["winner"]["reason"] == "judge (grok): the clearer fix"
    judge = data["judge"]
    assert judge["provider"] == "grok" and judge["status"] == "completed"
    assert judge["pick"] == second and judge["reason"] == "the clearer fix"
    assert "error" not in judge and judge["job_id"] not in [r["job_id"] for r in
                                                            data["attempts"]]
    # The judge's tokens count in the group's usage.
    rows_in = sum((row["usage"] or {}).get("input_tokens") or 0 for row in data["attempts"])
    assert data["usage"]["input_tokens"] > rows_in


@pytest.mark.parametrize(("mode", "config", "error", "status"), [
    ("garbage", {}, "not a JSON object", "completed"),
    (None, {}, "not a qualifying attempt", "completed"),
    ("hang", {"attempts": {"judge_timeout_s": 2}}, "timed_out", "timed_out"),
], ids=["garbage", "names-an-unqualified-attempt", "times-out"])
async def test_an_invalid_or_failed_judge_keeps_the_deterministic_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str | None,
        config: dict[str, Any], error: str, status: str) -> None:
    _, data = await judged_group(tmp_path, monkeypatch, mode, config)
    rows = data["attempts"]
    assert data["status"] == "done"
    assert [row["provider"] for row in rows[:2]] == ["claude", "claude"]
    if (tmp_path / "judge_mode.saw").exists():  # a judge timed out may not have started
        assert [row["job_id"] for row in rows[:2]] == judge_saw(tmp_path)
    assert data["winner"]["job_id"] == rows[0]["job_id"]
    assert "check passed" in data["winner"]["reason"]
    judge = data["judge"]
    assert judge["status"] == status and judge["pick"] is None
    assert error in judge["error"], json.dumps(judge)
