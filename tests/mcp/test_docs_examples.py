"""The agent walk-throughs of docs/tools.md ("How an agent uses them") and the README, and
docs/tools.md's deferred answer, are checked against real answers: their calls are made on a
real gateway (in-process, the fake CLIs), and every key their answers (`←`, `->`) name must
be in what that tool returned. A renamed or removed field (`poll_with`, once) fails here
instead of misleading a reader."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import Harness, own_harness
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
TEST_TIMEOUT_S = 90.0
CALL = re.compile(r"→\s*([a-z_]+)\(")
KEY = re.compile(r'"([a-z_]+)":')


def documented_keys() -> dict[str, set[str]]:
    """tool -> the keys its `←` answers in the walk-through name (nested ones included)."""
    text = (REPO / "docs" / "tools.md").read_text(encoding="utf-8")
    start = text.index("## How an agent uses them\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    keys: dict[str, set[str]] = {}
    for block in re.findall(r"^```text\n(.*?)^```", section, re.MULTILINE | re.DOTALL):
        tool = None
        for line in block.splitlines():
            call = CALL.search(line)
            if call:
                tool = call.group(1)
                line = line[call.end():]  # the call's own arguments are not answer keys
                if "←" not in line:
                    continue
            if tool and ("←" in line or line.startswith(" ")):
                keys.setdefault(tool, set()).update(KEY.findall(line.partition("←")[2] or line))
    # The README's short version writes `tool(...) -> {answer}`, an answer on the call's line
    # or the next; tools.md shows a deferred sync answer (the gemini call below defers).
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## How an agent should use the async tools\n")
    block = re.search(r"^```text\n(.*?)^```", readme[start:], re.MULTILINE | re.DOTALL)
    assert block, "the README lost its async walk-through"
    tool = None
    for line in block.group(1).splitlines():
        call = re.match(r"\s*([a-z_]+)\(", line)
        if call:
            tool = call.group(1)
        if tool and "->" in line:
            keys.setdefault(tool, set()).update(KEY.findall(line.partition("->")[2]))
    deferred = re.search(r'^```json\n(\{"job_id": .*?"deferred": true.*?)^```', text,
                         re.MULTILINE | re.DOTALL)
    assert deferred, "docs/tools.md lost its deferred answer"
    keys.setdefault("gemini_request", set()).update(KEY.findall(deferred.group(1)))
    return {tool: found for tool, found in keys.items() if found}


def all_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    with own_harness("inproc", tmp_path, monkeypatch) as harness:
        yield harness


async def test_every_key_of_the_tools_docs_walk_through_is_in_the_real_answers(
        harness: Harness) -> None:
    documented = documented_keys()
    assert {"codex_request_async", "llm_job_wait", "llm_job_result", "claude_request",
            "gemini_request"} <= set(documented), documented
    seen: dict[str, set[str]] = {}

    async def call(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result = await client.call_tool(tool, args)
        assert not result.is_error, (tool, result.content)
        data = result.structured_content
        assert data is not None, tool
        seen.setdefault(tool, set()).update(all_keys(data))
        return dict(data)

    tag = uuid.uuid4().hex[:8]
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with harness.connect() as client:
            started = await call(client, "codex_request_async",
                                 {"prompt": f"refactor {tag} @sleep=1.5"})
            assert started["status"] == "running", started  # a free run slot, as documented
            while not (await call(client, "llm_job_wait",
                                  {"job_id": started["job_id"], "timeout_s": 20}))["done"]:
                pass
            await call(client, "llm_job_result", {"job_id": started["job_id"]})
            answer = await call(client, "claude_request", {"prompt": f"summarise {tag}"})
            assert answer["status"] == "completed", answer  # within the default 45 s
        async with harness.connect(limits={"sync_defer_after_s": 1}) as client:
            deferred = await call(client, "gemini_request", {"prompt": f"review {tag} @sleep=4"})
            assert deferred["deferred"] is True
    missing = {tool: sorted(keys - seen.get(tool, set()))
               for tool, keys in documented.items() if keys - seen.get(tool, set())}
    assert not missing, f"docs/tools.md names keys these tools do not return: {missing}"
