"""A connected session that submitted a job is told when it ends (issue 40): a
`notifications/message`, level info, logger agent-cli-gateway, whose data is the notice.
Over stdio and Streamable HTTP, with the handshake-era client (the era whose sessions always
get log messages)."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import LoggingMessageNotificationParams

from tests.mcp.conftest import (
    CLIENT_TIMEOUT_S,
    TOKEN,
    Harness,
    http_client,
    own_harness,
    server_env,
)
from tests.mcp.test_tools import succeed

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def listening_client(harness: Harness, on_log: Any) -> AsyncIterator[Client]:
    config = harness.write_config({})
    if harness.transport == "inproc":
        from gateway.config import load_settings
        from gateway.mcp.server import build_server

        harness.monkeypatch.setenv("HOME", str(harness.home))
        harness.monkeypatch.setenv("PATH", server_env(harness.home, config)["PATH"])
        target: Any = build_server(load_settings(config))
    elif harness.transport == "http":
        server = harness.http_server({})
        async with http_client(server.url, TOKEN, logging_callback=on_log) as client:
            yield client
        return
    else:
        target = StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                       env=server_env(harness.home, config),
                                       cwd=str(harness.home))
    async with Client(target, mode="legacy", logging_callback=on_log,
                      read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        yield client


@pytest.mark.parametrize("transport", ["stdio-legacy", "http"])
async def test_the_session_that_submitted_a_job_is_told_when_it_ends(
        transport: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = tmp_path / f"gate-{uuid.uuid4().hex[:6]}"
    told: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        told.append(params)

    def about(job_id: str) -> list[LoggingMessageNotificationParams]:
        return [m for m in told if isinstance(m.data, dict) and m.data.get("job_id") == job_id]

    with own_harness(transport, tmp_path, monkeypatch) as harness, anyio.fail_after(90):
        async with listening_client(harness, on_log) as client:
            started = await succeed(client, "claude_request_async",
                                    {"prompt": f"tell me @until={gate}"})
            job_id = started["job_id"]
            assert about(job_id) == []  # not before it ends
            gate.touch()
            while not about(job_id):
                await anyio.sleep(0.05)
    (message,) = about(job_id)
    assert message.level == "info" and message.logger == "agent-cli-gateway"
    assert isinstance(message.data, dict)
    assert message.data["id"] == f"{job_id}:completed" and message.data["status"] == "completed"
