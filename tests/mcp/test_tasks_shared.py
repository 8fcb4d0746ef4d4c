"""A task is a job in the shared store: another gateway instance, and after a restart
another process, resolves and cancels it. SQLite and PostgreSQL."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.mcp.conftest import CLIENT_TIMEOUT_S, Harness, own_harness, server_env
from tests.mcp.task_client import (
    CreatedTask,
    TasksClientExtension,
    call_as_task,
    send,
    spawned_pid,
)
from tests.mcp.test_tasks import poll_until_done
from tests.mcp.test_tools import alive, tag
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 90.0



@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-auto", tmp_path, monkeypatch) as harness:
        yield harness


def gateway_process(harness: Harness, config: Path) -> Client:
    """`python -m gateway` over stdio (2026-07-28) with the extension advertised."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                   env=server_env(harness.home, config), cwd=str(harness.home))
    return Client(params, extensions=[TasksClientExtension()],
                  read_timeout_seconds=CLIENT_TIMEOUT_S)


def inproc_gateway(harness: Harness, config: Path) -> Client:
    from gateway.config import load_settings
    from gateway.mcp.server import build_server

    harness.monkeypatch.setenv("HOME", str(harness.home))
    harness.monkeypatch.setenv("PATH", server_env(harness.home, config)["PATH"])
    return Client(build_server(load_settings(config)), extensions=[TasksClientExtension()],
                  read_timeout_seconds=CLIENT_TIMEOUT_S)


async def test_another_instance_resolves_and_cancels_a_running_task(
        harness: Harness, store_config: dict[str, Any]) -> None:
    config = harness.write_config(store_config)
    marker = tag()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with inproc_gateway(harness, config) as owner, \
                inproc_gateway(harness, config) as other:
            created = await call_as_task(owner, "claude_request",
                                         {"prompt": f"long {marker} @sleep=30"})
            assert isinstance(created, CreatedTask)
            pid = await spawned_pid(harness, marker)

            seen = await send(other, "tasks/get", created.task_id)
            assert seen["status"] == "working"
            status = await other.call_tool("gateway_status", {})
            assert status.structured_content is not None
            mine = await owner.call_tool("gateway_status", {})
            assert mine.structured_content is not None
            assert status.structured_content["instance_id"] != \
                mine.structured_content["instance_id"]

            await send(other, "tasks/cancel", created.task_id)  # the owner's poller stops it
            task = await poll_until_done(other, created.task_id)
            assert task["status"] == "cancelled"
            assert (await send(owner, "tasks/get", created.task_id))["status"] == "cancelled"
    assert not alive(pid)


async def test_a_task_outlives_its_gateway_process_and_resolves_in_the_next_one(
        harness: Harness, store_config: dict[str, Any]) -> None:
    config = harness.write_config(store_config)
    prompt = f"restart {tag()}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway_process(harness, config) as first:
            created = await call_as_task(first, "codex_request", {"prompt": prompt})
            assert isinstance(created, CreatedTask)
            done = await poll_until_done(first, created.task_id)
            assert done["status"] == "completed"
        # The first process is gone; a new one, sharing only the store, answers the same.
        async with gateway_process(harness, config) as second:
            again = await send(second, "tasks/get", created.task_id)
            assert again["status"] == "completed"
            assert again["result"] == done["result"]
            assert again["result"]["content"][0]["text"].strip() == \
                f"fake-codex answer: {prompt}"


async def test_another_process_cancels_a_task_its_owner_is_running(
        harness: Harness, store_config: dict[str, Any]) -> None:
    config = harness.write_config(store_config)
    marker = tag()
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with gateway_process(harness, config) as owner:
            created = await call_as_task(owner, "cursor_request",
                                         {"prompt": f"long {marker} @sleep=30"})
            assert isinstance(created, CreatedTask)
            pid = await spawned_pid(harness, marker)
            async with gateway_process(harness, config) as other:
                await send(other, "tasks/cancel", created.task_id)
                task = await poll_until_done(other, created.task_id)
                assert task["status"] == "cancelled"
            assert not alive(pid)
