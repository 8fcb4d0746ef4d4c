"""The stdio transport at the byte level: stdout carries JSON-RPC and nothing else, and the
server leaves cleanly (jobs drained, instance marked stopped) on stdin EOF, SIGTERM and
SIGINT — the three ways MCP clients end a stdio server."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from anyio.abc import Process

from tests.mcp.conftest import Harness, server_env
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 5.0  # an MCP client SIGKILLs 2 s after its SIGTERM; drain is ~1.5 s
PROTOCOL_VERSION = "2025-06-18"


class RawStdioSession:
    """A hand-written JSON-RPC client that keeps every byte the server writes to stdout."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.stdout = bytearray()
        self.messages: list[dict[str, Any]] = []
        self._next_id = 0

    async def read_all(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            self.stdout += chunk
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    # Not parsed here: the test asserts on the raw bytes afterwards.
                    try:
                        self.messages.append(json.loads(line))
                    except ValueError:
                        self.messages.append({"unparsable": line.decode(errors="replace")})

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        request_id = self._next_id
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method,
                         "params": params or {}})
        while True:
            for message in self.messages:
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    assert "result" in message, message
                    return dict(message["result"])
            await anyio.sleep(0.02)

    async def call(self, tool: str, args: dict[str, Any], progress_token: str | None = None,
                   ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": tool, "arguments": args}
        if progress_token:
            params["_meta"] = {"progressToken": progress_token}
        result = await self.request("tools/call", params)
        assert not result.get("isError"), result
        return dict(result["structuredContent"])

    async def initialize(self) -> None:
        await self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "raw-test-client", "version": "0"}})
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


def db_row(db: Path, sql: str, *args: Any) -> sqlite3.Row | None:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        row: sqlite3.Row | None = conn.execute(sql, args).fetchone()
        return row


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def stdio_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    (tmp_path / "home").mkdir()
    return Harness("stdio-legacy", tmp_path, monkeypatch)


@pytest.mark.parametrize("ending", ["stdin_eof", "sigterm", "sigint"])
async def test_stdout_is_only_json_rpc_and_the_server_drains_and_stops_on_its_way_out(
        stdio_harness: Harness, ending: str) -> None:
    # on_shutdown = "stop": the running job is stopped with the gateway (detach is below).
    config = stdio_harness.write_config({"lease": {"on_shutdown": "stop"}})
    db = stdio_harness.db_of(config)
    stderr_path = stdio_harness.root / "server.stderr"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)), stderr_path.open("wb") as stderr:
        process = await anyio.open_process(
            [sys.executable, "-m", "gateway"], env=server_env(stdio_harness.home, config),
            cwd=stdio_harness.home, stderr=stderr)
        session = RawStdioSession(process)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.read_all)
            await session.initialize()
            tools = await session.request("tools/list")
            assert len(tools["tools"]) > 10
            # Provider runs that print plenty to their own stdout (and stderr), with progress
            # notifications flowing on ours.
            answer = await session.call(
                "claude_request", {"prompt": "chatty @stream=10:0.05 @bytes=300000 @stderr=noise"},
                progress_token="p1")
            assert answer["status"] == "completed"
            status = await session.call("gateway_status", {})
            instance_id = status["instance_id"]
            running = await session.call(
                "devin_request_async", {"prompt": "long @sleep=30 @late=5000 @ignore-term"})
            job_id = running["job_id"]
            while (await session.call("llm_job_status", {"job_id": job_id}))["status"] != "running":
                await anyio.sleep(0.05)
            # Marked running before its supervisor starts; the pid follows once it runs.
            while not (pid := db_row(db, "SELECT pid FROM jobs WHERE id = ?",
                                     job_id)["pid"]):  # type: ignore[index]
                await anyio.sleep(0.05)
            assert alive(pid)

            # Leave while that job runs, the way a client would.
            if ending == "stdin_eof":
                assert process.stdin is not None
                await process.stdin.aclose()
            else:
                process.send_signal(signal.SIGTERM if ending == "sigterm" else signal.SIGINT)
            with anyio.fail_after(scaled(EXIT_TIMEOUT_S)):
                returncode = await process.wait()
            tasks.cancel_scope.cancel()

    assert returncode == 0, stderr_path.read_text()
    raw = bytes(session.stdout)
    assert raw.endswith(b"\n")
    for line in raw.split(b"\n")[:-1]:
        message = json.loads(line)  # every line, including those written during shutdown
        assert message.get("jsonrpc") == "2.0", line[:200]
    assert any(m.get("method") == "notifications/progress" for m in session.messages)
    # The drain stopped the running job (its process group is gone) and deregistered.
    assert not alive(pid)
    job = db_row(db, "SELECT status, error_kind FROM jobs WHERE id = ?", job_id)
    assert job is not None and job["status"] not in ("queued", "running"), dict(job or {})
    instance = db_row(db, "SELECT stopped_at FROM gateway_instances WHERE instance_id = ?",
                      instance_id)
    assert instance is not None and instance["stopped_at"] is not None
    # Logs went to stderr (JSON lines), never to stdout.
    assert b"MCP server stopped" in stderr_path.read_bytes()


async def open_session(harness: Harness, config: Path, stderr: Any) -> tuple[Process,
                                                                            RawStdioSession]:
    process = await anyio.open_process(
        [sys.executable, "-m", "gateway"], env=server_env(harness.home, config),
        cwd=harness.home, stderr=stderr)
    return process, RawStdioSession(process)


@pytest.mark.parametrize("ending", ["stdin_eof", "claude_code"])
async def test_closing_the_window_leaves_the_run_running_and_the_next_session_reads_its_answer(
        stdio_harness: Harness, ending: str) -> None:
    config = stdio_harness.write_config({})  # on_shutdown = "detach", the default
    db = stdio_harness.db_of(config)
    prompt = "survive the window @sleep=2"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)), (stdio_harness.root / "s.stderr").open("wb") as err:
        process, session = await open_session(stdio_harness, config, err)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.read_all)
            await session.initialize()
            await session.request("tools/list")
            job_id = (await session.call("claude_request_async", {"prompt": prompt}))["job_id"]
            while (await session.call("llm_job_status", {"job_id": job_id}))["status"] != "running":
                await anyio.sleep(0.05)
            if ending == "stdin_eof":
                assert process.stdin is not None
                await process.stdin.aclose()
            else:  # what Claude Code does at the end of a session
                process.send_signal(signal.SIGINT)
                await anyio.sleep(0.1)
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            with anyio.fail_after(scaled(EXIT_TIMEOUT_S)):
                assert await process.wait() == 0
            tasks.cancel_scope.cancel()
        row = db_row(db, "SELECT status, pid FROM jobs WHERE id = ?", job_id)
        assert row is not None and row["status"] == "running" and alive(row["pid"])

        process, session = await open_session(stdio_harness, config, err)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.read_all)
            await session.initialize()
            await session.request("tools/list")
            done = await session.call("llm_job_wait", {"job_id": job_id, "timeout_s": 30})
            assert done["status"] == "completed", done
            result = await session.call("llm_job_result", {"job_id": job_id})
            assert result["output"] == f"fake-claude answer: {prompt}", result
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(scaled(EXIT_TIMEOUT_S)):
                await process.wait()
            tasks.cancel_scope.cancel()


async def test_a_client_that_never_lists_the_tools_still_gets_a_started_gateway(
        stdio_harness: Harness) -> None:
    """The start waits for the handshake (the first tools/list), but not forever: a client
    that only initializes and asks for the status sees the gateway become ready and its
    instance registered, with no job tool called."""
    config = stdio_harness.write_config({})
    db = stdio_harness.db_of(config)
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        process = await anyio.open_process(
            [sys.executable, "-m", "gateway"], env=server_env(stdio_harness.home, config),
            cwd=stdio_harness.home, stderr=subprocess.DEVNULL)
        session = RawStdioSession(process)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.read_all)
            await session.initialize()
            status = await session.call("gateway_status", {})
            while not status["ready"]:
                await anyio.sleep(0.05)
                status = await session.call("gateway_status", {})
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.fail_after(scaled(EXIT_TIMEOUT_S)):
                assert await process.wait() == 0
            tasks.cancel_scope.cancel()
    assert not any("tools" in m.get("result", {}) for m in session.messages)
    instance = db_row(db, "SELECT role FROM gateway_instances WHERE instance_id = ?",
                      status["instance_id"])
    assert instance is not None and instance["role"] == "stdio"


def _handshake_lines() -> list[bytes]:
    return [json.dumps(message).encode() for message in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "raw-test-client", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})]


def _answers(raw: bytes) -> dict[int, dict[str, Any]]:
    messages = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return {m["id"]: m for m in messages if "id" in m}


def test_a_request_from_a_regular_file_is_answered_though_its_line_has_no_newline(
        stdio_harness: Harness) -> None:
    """stdin a file (`agent-cli-gateway < request.json`): read by a thread, not the loop's
    pipe transport; a last line with no newline is still a request, and EOF ends serving."""
    config = stdio_harness.write_config({})
    requests = stdio_harness.root / "request.json"
    requests.write_bytes(_handshake_lines()[0])  # no newline after it
    with requests.open("rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "gateway"], stdin=stdin,
                              capture_output=True, timeout=TEST_TIMEOUT_S,
                              env=server_env(stdio_harness.home, config),
                              cwd=stdio_harness.home)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    answers = _answers(done.stdout)
    assert set(answers) == {1} and answers[1]["result"]["serverInfo"]["name"]


def test_a_socket_for_stdio_is_served_like_a_pipe(stdio_harness: Harness) -> None:
    """Node-based clients (Claude Desktop, the TypeScript SDK, the Inspector) give their
    stdio servers Unix socket pairs, not pipes: read on the loop all the same."""
    import socket

    config = stdio_harness.write_config({})
    ours, theirs = socket.socketpair()
    with ours, theirs:
        process = subprocess.Popen([sys.executable, "-m", "gateway"], stdin=theirs.fileno(),
                                   stdout=theirs.fileno(), stderr=subprocess.PIPE,
                                   env=server_env(stdio_harness.home, config),
                                   cwd=stdio_harness.home)
        theirs.close()
        try:
            ours.sendall(b"".join(line + b"\n" for line in _handshake_lines()))
            ours.settimeout(TEST_TIMEOUT_S)
            raw = b""
            while 2 not in _answers(raw.rsplit(b"\n", 1)[0]):
                chunk = ours.recv(65536)
                assert chunk, "the gateway closed its end before answering"
                raw += chunk
            ours.shutdown(socket.SHUT_WR)  # EOF: the client is done
            returncode = process.wait(timeout=TEST_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
            stderr = process.communicate()[1].decode()
    assert returncode == 0, stderr[-2000:]
    assert len(_answers(raw.rsplit(b"\n", 1)[0])[2]["result"]["tools"]) > 10
