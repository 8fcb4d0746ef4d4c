"""Honest replays, and results complete on their own (issue 14).

Claude Code and Codex hand the model only a successful result's `structuredContent`: what
the model needs to act (the next call, the answer, that an answer is a replay) must be in
it, not only in the text. Over every transport (tests/mcp/conftest.py).
"""

from __future__ import annotations

import anyio
import pytest

from tests.mcp.conftest import Harness, first_text
from tests.mcp.test_tools import TEST_TIMEOUT_S, call, fake_spawns, succeed, tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio


async def test_a_completed_answer_reused_within_the_window_says_it_is_a_replay(
        gateway: Harness) -> None:
    prompt = f"replay me {tag()}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            first = await succeed(client, "claude_request", {"prompt": prompt})
            again = await call(client, "claude_request", {"prompt": prompt})
            forced = await succeed(client, "claude_request",
                                   {"prompt": prompt, "force_refresh": True})
    assert first["reuse"] is None and first["deduplicated"] is False
    data = again.structured_content
    assert data is not None and not again.is_error
    assert data["job_id"] == first["job_id"] and data["deduplicated"] is True
    reuse = data["reuse"]
    assert reuse["kind"] == "replay" and reuse["job_id"] == first["job_id"]
    assert reuse["finished_at"] and 0 <= reuse["finished_s_ago"] < TEST_TIMEOUT_S
    assert "force_refresh=true" in reuse["notice"] and first["job_id"] in reuse["notice"]
    assert data["text"] == first["text"]  # the answer itself is still there, unchanged
    text = first_text(again)
    assert text.startswith("[REPLAYED ANSWER, not a new run: job " + first["job_id"])
    assert "s ago" in text and "force_refresh=true" in text
    assert forced["job_id"] != first["job_id"] and forced["reuse"] is None
    assert len(fake_spawns(gateway.fake_log, prompt)) == 2


async def test_past_the_window_an_identical_request_is_new_work(gateway: Harness) -> None:
    prompt = f"run the tests and fix what fails {tag()}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect(persistence={"dedup_window_s": 0}) as client:
            first = await succeed(client, "codex_request", {"prompt": prompt})
            second = await succeed(client, "codex_request", {"prompt": prompt})
    assert second["job_id"] != first["job_id"]
    assert second["deduplicated"] is False and second["reuse"] is None


async def test_joining_a_running_identical_job_says_so_and_names_the_next_call(
        gateway: Harness) -> None:
    prompt = f"long one {tag()} @sleep=3"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            started = await succeed(client, "gemini_request_async", {"prompt": prompt})
            joined = await succeed(client, "gemini_request_async", {"prompt": prompt})
            await succeed(client, "llm_job_cancel", {"job_id": started["job_id"]})
    assert joined["job_id"] == started["job_id"]
    assert joined["reuse"]["kind"] == "joined"
    assert "joined" in joined["reuse"]["notice"] and "joined" in joined["message"]
    assert joined["next"] == {"tool": "llm_job_wait",
                              "arguments": {"job_id": started["job_id"]},
                              "why": joined["next"]["why"]}


async def test_structured_content_alone_leads_from_submit_to_the_whole_answer(
        gateway: Harness) -> None:
    """Follow only `next` (as a model that sees nothing else would): submit, wait, read every
    page; the pages put together are the answer."""
    prompt = f"paged {tag()} @bytes=300000"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            data = await succeed(client, "claude_request_async",
                                 {"prompt": prompt, "output_format": "text"})
            pages: list[str] = []
            calls = 0
            while data.get("next") is not None:
                step = data["next"]
                assert set(step) == {"tool", "arguments", "why"} and step["why"]
                data = await succeed(client, step["tool"], step["arguments"])
                if step["tool"] == "llm_job_result":
                    pages.append(data["output"])
                calls += 1
                assert calls < 50
    assert data["status"] == "completed" and data["complete"] is True
    answer = "".join(pages)
    assert len(answer.encode()) == data["total_bytes"] >= 300_000
    assert len(pages) >= 2  # it did follow a next offset


async def test_progress_notifications_count_output_bytes(gateway: Harness) -> None:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway.connect() as client:
            data = await succeed(client, "claude_request",
                                 {"prompt": f"streams {tag()} @stream=30:0.1"},
                                 progress_callback=on_progress)
    assert data["status"] == "completed"
    values = [p for p, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing
    grown = [(p, m) for p, m in seen if p >= 1]
    assert grown, seen  # output bytes, not a counter from zero
    assert all(m and f"{int(p)} bytes" in m for p, m in grown)
    assert max(values) <= data["output_bytes"] + 1
