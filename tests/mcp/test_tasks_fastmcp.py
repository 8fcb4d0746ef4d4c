"""The tasks extension (2026-07-28) through FastMCP's own client with `fastmcp-tasks`: the
client this project did not write that speaks SEP-2663 today. Over stdio, as a host runs
the gateway."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import fastmcp_tasks
import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from tests.mcp.conftest import Harness, first_text, own_harness, server_env
from tests.mcp.task_client import spawned_pid
from tests.mcp.test_tools import alive, tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-auto", tmp_path, monkeypatch) as harness:
        yield harness


def fastmcp_client(harness: Harness) -> Client[StdioTransport]:
    config = harness.write_config({})
    transport = StdioTransport(sys.executable, ["-m", "gateway"],
                               env=server_env(harness.home, config), cwd=str(harness.home),
                               keep_alive=False, log_file=harness.root / "gateway.stderr")
    return Client(transport, timeout=TEST_TIMEOUT_S)


async def test_fastmcp_gets_a_task_handle_and_the_real_answer(harness: Harness) -> None:
    prompt = f"fastmcp {tag()} @sleep=0.5"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with fastmcp_client(harness) as client:
            task = await fastmcp_tasks.call_tool_task(client, "claude_request",
                                                      {"prompt": prompt})
            assert task.create_result.status == "working"
            assert task.create_result.ttl_ms is not None
            status = await task.status()
            assert status.task_id == task.task_id
            result = await task.result()
            assert not result.is_error
            assert first_text(result).strip() == f"fake-claude answer: {prompt}"
            assert result.structured_content is not None
            assert result.structured_content["job_id"] == task.task_id

            # Its plain call_tool drives a task transparently: the caller sees the answer.
            again = await client.call_tool("gemini_request", {"prompt": f"{prompt} plain"})
            assert first_text(again).strip() == f"fake-gemini answer: {prompt} plain"


async def test_fastmcp_cancels_a_task_and_sees_a_failed_run_as_an_error(
        harness: Harness) -> None:
    marker = tag()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with fastmcp_client(harness) as client:
            task = await fastmcp_tasks.call_tool_task(client, "codex_request",
                                                      {"prompt": f"long {marker} @sleep=30"},
                                                      raise_on_error=False)
            pid = await spawned_pid(harness, marker)
            await task.cancel()
            final = await task.wait(timeout=scaled(20))
            assert final.status == "cancelled"

            failed = await fastmcp_tasks.call_tool_task(client, "claude_request",
                                                        {"prompt": f"who {tag()} @auth"},
                                                        raise_on_error=False)
            done = await failed.wait(timeout=scaled(20))
            assert done.status == "completed"  # the run failed; the task did not
            result = await failed.result()
            assert result.is_error
            assert result.structured_content is not None
            assert result.structured_content["error_kind"] == "auth"
    assert not alive(pid)
