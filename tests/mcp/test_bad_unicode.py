"""A lone surrogate in any string argument is answered with an error, never a hang.

The SDK's client never sends such text, so the requests are raw JSON bytes: one line on
the stdin of a real `python -m gateway`, and one POST to a real HTTP gateway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.mcp.conftest import Harness, free_port, server_env, start_http_server
from tests.mcp.test_http import INITIALIZE, MCP_HEADERS
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

ANSWER_TIMEOUT_S = 30.0  # a cold gateway start on a loaded box, then one answer
# A lone surrogate as a JSON escape (valid JSON syntax), in each kind of string argument.
BAD_CALLS = [
    ("claude_request", '{"prompt": "hi \\ud800 there"}'),
    ("claude_request", '{"prompt": "ok", "model": "\\udfff"}'),
    ("llm_job_status", '{"job_id": "\\ud800"}'),
    ("llm_job_list", '{"provider": "\\udc00x"}'),
]
PARSE_ERROR = -32700


def tool_call(request_id: int, name: str, arguments: str) -> bytes:
    return (f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call", '
            f'"params": {{"name": "{name}", "arguments": {arguments}}}}}').encode()


@pytest.fixture
def harness(http_harness: Harness) -> Harness:
    return http_harness


async def test_a_lone_surrogate_over_stdio_gets_a_parse_error_for_its_id(
        harness: Harness) -> None:
    config = harness.write_config({})
    process = await anyio.open_process(
        [sys.executable, "-m", "gateway"], env=server_env(harness.home, config),
        cwd=harness.home, stderr=subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    buffered = b""

    async def answer() -> dict[str, object]:
        nonlocal buffered
        assert process.stdout is not None
        while b"\n" not in buffered:
            buffered += await process.stdout.receive()
        line, buffered = buffered.split(b"\n", 1)
        return dict(json.loads(line))

    try:
        with anyio.fail_after(scaled(ANSWER_TIMEOUT_S)):
            await process.stdin.send(json.dumps(INITIALIZE).encode() + b"\n")
            assert (await answer())["id"] == 1
            await process.stdin.send(b'{"jsonrpc": "2.0", "method": '
                                     b'"notifications/initialized"}\n')
            for request_id, (name, arguments) in enumerate(BAD_CALLS, start=10):
                await process.stdin.send(tool_call(request_id, name, arguments) + b"\n")
                got = await answer()
                assert got["id"] == request_id, got
                error = got["error"]
                assert isinstance(error, dict) and error["code"] == PARSE_ERROR
                assert "surrogate" in error["message"]
            # The session goes on serving.
            await process.stdin.send(b'{"jsonrpc": "2.0", "id": 99, "method": "tools/list"}\n')
            assert (await answer())["id"] == 99
    finally:
        await process.stdin.aclose()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_lone_surrogate_over_streamable_http_gets_a_parse_error_for_its_id(
        harness: Harness) -> None:
    server = start_http_server(harness.home, harness.write_config({}), free_port(),
                               token=None, args=("--no-auth",))
    try:
        with httpx2.Client(timeout=ANSWER_TIMEOUT_S) as http:
            opened = http.post(server.url, json=INITIALIZE, headers=MCP_HEADERS)
            headers = dict(MCP_HEADERS, **{"mcp-session-id": opened.headers["mcp-session-id"],
                                           "mcp-protocol-version": "2025-06-18"})
            http.post(server.url, headers=headers,
                      content=b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
            raw_utf8 = ("claude_request", '{"prompt": "\xed\xa0\x80"}')  # surrogate as bytes
            for request_id, (name, arguments) in enumerate([*BAD_CALLS, raw_utf8], start=10):
                body = tool_call(request_id, name, arguments)
                if (name, arguments) == raw_utf8:
                    body = body.decode().encode("latin-1")  # the bytes ED A0 80, not UTF-8
                answer = http.post(server.url, headers=headers, content=body)
                assert answer.status_code == 400
                got = answer.json()
                assert got["id"] == request_id, got
                assert got["error"]["code"] == PARSE_ERROR
                assert "surrogate" in got["error"]["message"]
            # Not a request at all: the SDK's own parse error stands.
            answer = http.post(server.url, headers=headers, content=b"{not json")
            assert answer.status_code == 400 and answer.json()["id"] is None
    finally:
        server.stop()


async def test_a_lone_surrogate_that_reaches_a_tool_is_invalid_input_with_nothing_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process client (or a lenient parser) hands the tool the Python string itself:
    found by the property test, it crashed request_key with UnicodeEncodeError."""
    from mcp import Client

    from gateway.config import load_settings
    from gateway.mcp.server import build_server

    (tmp_path / "home").mkdir()
    harness = Harness("inproc", tmp_path, monkeypatch)
    config = harness.write_config({})
    monkeypatch.setenv("HOME", str(harness.home))
    monkeypatch.setenv("PATH", server_env(harness.home, config)["PATH"])
    with anyio.fail_after(scaled(ANSWER_TIMEOUT_S)):
        async with Client(build_server(load_settings(config))) as client:
            cases: list[tuple[str, dict[str, Any]]] = [
                ("claude_request", {"prompt": "x\udfff"}),
                ("claude_request_async", {"prompt": "ok", "add_dirs": ["\ud800"]}),
                ("llm_job_status", {"job_id": "\ud800"}),
            ]
            for name, arguments in cases:
                result = await client.call_tool(name, arguments)
                assert result.is_error
                assert result.structured_content is not None
                assert result.structured_content["error_kind"] == "invalid_input"
                assert "surrogate" in result.content[0].text  # type: ignore[union-attr]
            listed = await client.call_tool("llm_job_list", {})
            assert listed.structured_content is not None
            assert listed.structured_content["jobs"] == []
