"""The `gateway` fixture: one harness per transport, so the same test bodies run on each.

- inproc: `Client(build_server(settings))`, the server in the test's own event loop;
- stdio-legacy / stdio-auto: `python -m gateway` spawned by the SDK's stdio client, with a
  tmp HOME, the fake CLIs first on PATH and the config in a tmp file (AGENT_GATEWAY_CONFIG);
- http: `python -m gateway serve --transport http --port <free>` with a bearer token, one
  server per module for the default config (a dedicated one when a test needs other
  settings), reached with the SDK's Streamable HTTP client.

Tests bound every connect and call with `anyio.fail_after` around the whole body (a cancel
scope must be left by the task that entered it, so the harness adds none of its own).
Each `connect(**overrides)` writes a config file of its own: overrides are merged into the
base config per section (`limits={"sync_defer_after_s": 1}`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx2
import pytest
import tomli_w
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from gateway import platform
from gateway.config import merge_tables
from tests.waiting import scaled

REPO = Path(__file__).resolve().parents[2]
FAKES_BIN = REPO / "tests" / "fakes" / "bin"

# Short lease knobs: shutdown and the lease loops are observable in a fast test.
FAST_LEASE = {"heartbeat_s": 0.2, "ttl_s": 1.0, "http_job_grace_s": 1.0,
              "sweep_interval_s": 0.2, "instance_gc_s": 1.0, "cancel_poll_s": 0.2,
              "drain_timeout_s": 1.5}
BASE_LIMITS = {"kill_grace_s": 1.0}

SERVER_START_TIMEOUT_S = 30.0  # a cold `python -m gateway` on a loaded 2-core box
CLIENT_TIMEOUT_S = 60.0  # no single request of these tests should take longer
HTTP_STOP_TIMEOUT_S = 10.0
# The same in every copy of this module: pytest imports a conftest.py without an __init__.py
# as `conftest`, and the tests import it again as `tests.mcp.conftest`; a token drawn at
# import time made a server started by a fixture here refuse a test's requests (401).
TOKEN = f"test-token-{os.getpid()}"

TRANSPORTS = ["inproc", "stdio-legacy", "stdio-auto", "http"]


class ToolAnswer(Protocol):
    """A tool call's result, as the SDK's client or fastmcp's client returns it."""

    @property
    def content(self) -> Sequence[object]: ...


def first_text(result: ToolAnswer) -> str:
    """The text of a tool result's first content block (every gateway tool answers text)."""
    block = result.content[0]
    assert isinstance(block, TextContent), f"expected text content, got {block!r}"
    return block.text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(home: Path, config: Path, **extra: str) -> dict[str, str]:
    """Exactly what the gateway child gets (the SDK's stdio client passes nothing else)."""
    env = {
        "HOME": str(home),
        "PATH": f"{FAKES_BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "AGENT_GATEWAY_CONFIG": str(config),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    # The platform_impl fixture's choice (set for its test only) reaches the gateway too.
    if platform.ENV_VAR in os.environ:
        env.setdefault(platform.ENV_VAR, os.environ[platform.ENV_VAR])
    return env


@dataclass
class HttpServer:
    """A `python -m gateway serve --transport http` child process."""

    process: subprocess.Popen[bytes]
    url: str
    base: str
    stderr_path: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(HTTP_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""


def start_http_server(home: Path, config: Path, port: int, *, token: str | None = TOKEN,
                      args: tuple[str, ...] = (), wait_ready: bool = True,
                      host: str = "127.0.0.1") -> HttpServer:
    """Spawn the HTTP server and wait (bounded) until /healthz answers (and, with
    wait_ready, says the gateway is ready)."""
    extra = {"AGENT_GATEWAY_HTTP__AUTH_TOKEN": token} if token else {}
    stderr_path = home / f"http-{port}.stderr"
    with stderr_path.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--transport", "http",
             "--host", host, "--port", str(port), *args],
            env=server_env(home, config, **extra), cwd=home, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    base = f"http://{host}:{port}"
    server = HttpServer(process, f"{base}/mcp", base, stderr_path)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    with httpx2.Client(timeout=scaled(2.0)) as http:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"HTTP gateway exited {process.returncode}:\n{server.stderr()}")
            with contextlib.suppress(httpx2.HTTPError):
                answer = http.get(f"{base}/healthz")
                if answer.status_code == 200 and (answer.json().get("ready") or not wait_ready):
                    return server
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"HTTP gateway not ready in {SERVER_START_TIMEOUT_S} s:\n"
                                   f"{server.stderr()}")
            time.sleep(0.05)


@dataclass
class Harness:
    """Connects MCP clients to a gateway over one transport, with per-connect config."""

    transport: str
    root: Path
    monkeypatch: pytest.MonkeyPatch
    shared_http: HttpServer | None = None
    shared_client: Client | None = None  # the module's stdio client (default config)
    wait_ready: bool = True  # False: a test of a gateway whose store cannot open
    _servers: list[HttpServer] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def fake_log(self) -> Path:
        return self.root / "fake-cli.log"

    def base_config(self, db_name: str) -> dict[str, Any]:
        return {
            "persistence": {"backend": "sqlite", "path": str(self.root / "state" / db_name)},
            "lease": dict(FAST_LEASE),
            "limits": dict(BASE_LIMITS),
            "logging": {"level": "info", "format": "json"},
            "providers": {name: {"env": {"FAKE_CLI_LOG": str(self.fake_log)}}
                          for name in ("claude", "codex", "gemini", "grok", "mistral",
                                       "devin", "cursor")},
        }

    def write_config(self, overrides: dict[str, Any]) -> Path:
        """A config file of its own (and so a SQLite file of its own) per call."""
        name = uuid.uuid4().hex[:12]
        config = merge_tables(self.base_config(f"jobs-{name}.db"), overrides)
        path = self.root / f"config-{name}.toml"
        path.write_bytes(tomli_w.dumps(config).encode())
        return path

    @staticmethod
    def db_of(config: Path) -> Path:
        return Path(tomllib.loads(config.read_text())["persistence"]["path"])

    @contextlib.asynccontextmanager
    async def connect(self, **overrides: Any) -> AsyncIterator[Client]:
        """An initialized MCP client to a gateway configured with `overrides`."""
        if self.transport == "inproc":
            async with self._inproc(overrides) as client:
                yield client
        elif self.transport.startswith("stdio"):
            if not overrides and self.shared_client is not None:
                yield self.shared_client
                return
            mode = "legacy" if self.transport == "stdio-legacy" else "auto"
            async with stdio_client(self.home, self.write_config(overrides), mode) as client:
                yield client
        else:
            server = self.http_server(overrides)
            async with http_client(server.url, TOKEN) as client:
                yield client

    def http_server(self, overrides: dict[str, Any]) -> HttpServer:
        if not overrides and self.shared_http is not None:
            return self.shared_http
        server = start_http_server(self.home, self.write_config(overrides), free_port(),
                                   wait_ready=self.wait_ready)
        self._servers.append(server)
        return server

    @contextlib.asynccontextmanager
    async def _inproc(self, overrides: dict[str, Any]) -> AsyncIterator[Client]:
        from gateway.config import load_settings
        from gateway.mcp.server import build_server

        config = self.write_config(overrides)
        self.monkeypatch.setenv("HOME", str(self.home))
        self.monkeypatch.setenv("PATH", server_env(self.home, config)["PATH"])
        settings = load_settings(config)
        async with Client(build_server(settings), read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            yield client

    def close(self) -> None:
        for server in self._servers:
            server.stop()


@contextlib.contextmanager
def own_harness(transport: str, tmp_path: Path, monkeypatch: Any) -> Iterator[Harness]:
    """A harness of its own (own config, store and fake-CLI log) for one test; the servers
    it started are stopped at the end."""
    (tmp_path / "home").mkdir()
    harness = Harness(transport, tmp_path, monkeypatch)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def http_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The harness of the HTTP transport tests (`serve --transport http` children)."""
    with own_harness("http", tmp_path, monkeypatch) as harness:
        yield harness


@contextlib.asynccontextmanager
async def stdio_client(home: Path, config: Path, mode: str,
                       **env: str) -> AsyncIterator[Client]:
    """`python -m gateway` spawned by the SDK's stdio client, as an MCP host would (`env`:
    variables its `env` block adds)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                   env=server_env(home, config, **env), cwd=str(home))
    async with Client(params, mode=mode, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
        yield client


@contextlib.asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "legacy",
                      **client_options: Any) -> AsyncIterator[Client]:
    """An SDK client over Streamable HTTP (`client_options`: Client's own, e.g. a
    logging_callback)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode,
               read_timeout_seconds=CLIENT_TIMEOUT_S, **client_options) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def shared_http_server(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, Path]]:
    """One HTTP gateway with the default test config for a whole module (startup is the
    slow part of an HTTP test)."""
    root = tmp_path_factory.mktemp("http-shared")
    (root / "home").mkdir()
    harness = Harness("http", root, pytest.MonkeyPatch())
    server = start_http_server(harness.home, harness.write_config({}), free_port())
    try:
        yield server, root
    finally:
        server.stop()


@dataclass
class SharedStdio:
    client: Client
    root: Path


async def _shared_stdio(factory: pytest.TempPathFactory, mode: str) -> AsyncIterator[SharedStdio]:
    root = factory.mktemp(f"stdio-{mode}-shared")
    (root / "home").mkdir()
    config = Harness(f"stdio-{mode}", root, pytest.MonkeyPatch()).write_config({})
    # anyio runs fixtures and tests one after the other in a single runner task: a cancel
    # scope opened here would still be open during the module's tests, so only the first
    # call is bounded (initialize itself is bounded by the client's read timeout).
    async with stdio_client(root / "home", config, mode) as client:
        with anyio.fail_after(scaled(SERVER_START_TIMEOUT_S)):
            await client.list_tools()
        yield SharedStdio(client, root)


@pytest.fixture(scope="module")
async def shared_stdio_legacy(
        tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SharedStdio]:
    """One stdio gateway per module for the tests that need no special config: spawning
    `python -m gateway` is most of a stdio test's cost."""
    async for shared in _shared_stdio(tmp_path_factory, "legacy"):
        yield shared


@pytest.fixture(scope="module")
async def shared_stdio_auto(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SharedStdio]:
    async for shared in _shared_stdio(tmp_path_factory, "auto"):
        yield shared


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so the shared stdio clients live in one event loop for the module."""
    return "asyncio"


@pytest.fixture(params=TRANSPORTS)
def gateway(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    transport = str(request.param)
    if transport == "http":
        server, root = request.getfixturevalue("shared_http_server")
        harness = Harness(transport, root, monkeypatch, shared_http=server)
    elif transport.startswith("stdio"):
        shared: SharedStdio = request.getfixturevalue(
            "shared_stdio_legacy" if transport == "stdio-legacy" else "shared_stdio_auto")
        harness = Harness(transport, shared.root, monkeypatch, shared_client=shared.client)
    else:
        with own_harness(transport, tmp_path, monkeypatch) as harness:
            yield harness
        return
    try:
        yield harness
    finally:
        harness.close()


# The tools every gateway lists whatever is installed (the request tools come per provider).
JOB_TOOLS = {"llm_job_status", "llm_job_result", "llm_job_cancel", "llm_job_wait",
             "llm_job_list", "list_models", "gateway_status", "llm_job_changes",
             "llm_usage", "llm_attempts", "llm_attempts_status", "llm_attempts_pick"}


@pytest.fixture(params=["sqlite", "postgres"])
def store_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The store every gateway of a test's config shares: the harness's own SQLite file
    (no key), or the throwaway PostgreSQL."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        return {"persistence": {"backend": "postgres", "dsn": dsn}}
    return {}
