"""The Streamable HTTP transport's protections: bearer auth, body cap, session cap,
/healthz, and one gateway shared by every session of the process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError

from gateway.config import load_settings
from gateway.mcp.serve import ServeError, serve
from tests.mcp.conftest import (
    TOKEN,
    Harness,
    HttpServer,
    free_port,
    http_client,
    start_http_server,
)
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
INITIALIZE: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "raw-http-test", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


@pytest.fixture
def harness(http_harness: Harness) -> Harness:
    return http_harness


@pytest.fixture
def server(harness: Harness) -> HttpServer:
    """A gateway with small HTTP limits so the caps are reachable in a test."""
    return harness.http_server({"http": {"max_body_bytes": 20_000, "max_sessions": 2}})


def flatten(exc: BaseException) -> list[BaseException]:
    """The leaves of (nested) exception groups: the SDK wraps a 401 in two of them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in flatten(inner)]
    return [exc]


def post(server: HttpServer, body: Any, token: str | None = TOKEN,
         headers: dict[str, str] | None = None) -> httpx2.Response:
    sent = dict(MCP_HEADERS, **(headers or {}))
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx2.Client(timeout=scaled(10)) as http:
        return http.post(server.url, content=content, headers=sent)


async def test_requests_without_the_right_bearer_token_get_401(server: HttpServer) -> None:
    for token in (None, "wrong-" + TOKEN, TOKEN + "x", TOKEN[:-1]):
        answer = post(server, INITIALIZE, token=token)
        assert answer.status_code == 401, token
        assert answer.headers["www-authenticate"].startswith("Bearer")
    assert post(server, INITIALIZE).status_code == 200

    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        for token in (None, "wrong-token"):
            with pytest.raises(BaseException) as caught:
                async with http_client(server.url, token) as client:
                    await client.list_tools()
            leaves = flatten(caught.value)
            assert any(isinstance(e, MCPError) for e in leaves), leaves


async def test_healthz_answers_without_a_token_and_tells_nothing_but_readiness(
        server: HttpServer) -> None:
    with httpx2.Client(timeout=scaled(10)) as http:
        answer = http.get(f"{server.base}/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"ok": True, "ready": True, "admitting": True}


async def test_a_request_body_over_the_cap_gets_413(server: HttpServer) -> None:
    big = dict(INITIALIZE, params={**INITIALIZE["params"], "padding": "x" * 30_000})
    assert post(server, big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the SDK's streaming cap applies
        data = json.dumps(big).encode()
        for start in range(0, len(data), 4096):
            yield data[start:start + 4096]

    with httpx2.Client(timeout=scaled(10)) as http:
        answer = http.post(server.url, content=chunks(),
                           headers=dict(MCP_HEADERS, Authorization=f"Bearer {TOKEN}"))
    assert answer.status_code == 413
    # The cap is about size only: a normal request still works.
    assert post(server, INITIALIZE).status_code == 200


async def test_every_http_session_shares_one_gateway_and_its_jobs(harness: Harness) -> None:
    server = harness.http_server({})
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with http_client(server.url, TOKEN) as first, \
                http_client(server.url, TOKEN, mode="auto") as second:
            started = await first.call_tool("claude_request_async",
                                            {"prompt": "shared @sleep=0.3"})
            assert started.structured_content is not None
            job_id = started.structured_content["job_id"]
            seen = await second.call_tool("llm_job_wait", {"job_id": job_id, "timeout_s": 20})
            assert seen.structured_content is not None
            assert seen.structured_content["status"] == "completed"
            one = await first.call_tool("gateway_status", {})
            two = await second.call_tool("gateway_status", {})
    assert one.structured_content and two.structured_content
    assert one.structured_content["instance_id"] == two.structured_content["instance_id"]
    assert one.structured_content["role"] == "http"


async def test_no_auth_serves_without_a_token_on_loopback(harness: Harness) -> None:
    server = start_http_server(harness.home, harness.write_config({}), free_port(),
                               token=None, args=("--no-auth",))
    try:
        with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
            async with http_client(server.url, None) as client:
                tools = await client.list_tools()
        assert any(t.name == "gateway_status" for t in tools.tools)
    finally:
        server.stop()


def test_serve_refuses_http_without_a_token_or_no_auth_off_loopback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AGENT_GATEWAY_HTTP__AUTH_TOKEN", raising=False)
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    settings = load_settings(persistence={"path": str(tmp_path / "jobs.db")})
    with pytest.raises(ServeError, match="bearer token"):
        serve(settings, transport="http", host="127.0.0.1", port=free_port())
    with pytest.raises(ServeError, match="loopback"):
        serve(settings, transport="http", host="0.0.0.0", port=free_port(), no_auth=True)
    with pytest.raises(ServeError, match="transport"):
        serve(settings, transport="carrier-pigeon")
    assert not (tmp_path / "jobs.db").exists()  # refused before anything was opened


def raw(server: HttpServer, method: str, headers: dict[str, str], body: Any = None,
        url: str | None = None) -> httpx2.Response:
    """One request with exactly these headers (httpx2 sends Host from the URL unless given)."""
    content = None if body is None else json.dumps(body).encode()
    with httpx2.Client(timeout=scaled(10)) as http:
        return http.request(method, url or server.url, content=content, headers=headers)


async def test_dns_rebinding_host_header_is_refused_on_every_loopback_address(
        harness: Harness) -> None:
    config = harness.write_config({})
    for host in ("127.0.0.1", "127.0.0.2"):
        port = free_port()
        server = start_http_server(harness.home, config, port, token=None, host=host,
                                   args=("--no-auth",))
        try:
            attacked = raw(server, "POST", dict(MCP_HEADERS, Host=f"attacker.example:{port}"),
                           INITIALIZE)
            assert attacked.status_code == 421, (host, attacked.text)
            wrong_port = raw(server, "POST", dict(MCP_HEADERS, Host=f"{host}:{port + 1}"),
                             INITIALIZE)
            assert wrong_port.status_code == 421
            # /healthz is checked too: a rebinding page learns nothing from it.
            assert raw(server, "GET", {"Host": "attacker.example"},
                       url=f"{server.base}/healthz").status_code == 421
            for good in (f"{host}:{port}", f"localhost:{port}"):
                assert raw(server, "POST", dict(MCP_HEADERS, Host=good),
                           INITIALIZE).status_code == 200, good
        finally:
            server.stop()


async def test_dns_rebinding_foreign_origin_is_refused_with_or_without_a_token(
        harness: Harness) -> None:
    allowed = "http://localhost:6274"
    config = harness.write_config({"http": {"allowed_origins": [allowed]}})
    with_token = start_http_server(harness.home, config, free_port())
    without = start_http_server(harness.home, config, free_port(), token=None,
                                host="127.0.0.3", args=("--no-auth",))
    try:
        for server, auth in ((with_token, {"Authorization": f"Bearer {TOKEN}"}),
                             (without, {})):
            foreign = raw(server, "POST",
                          dict(MCP_HEADERS, Origin="http://attacker.example", **auth),
                          INITIALIZE)
            assert foreign.status_code == 403, foreign.text
            assert "allowed_origins" in foreign.json()["message"]
            listed = raw(server, "POST", dict(MCP_HEADERS, Origin=allowed, **auth), INITIALIZE)
            assert listed.status_code == 200
            assert raw(server, "POST", dict(MCP_HEADERS, **auth), INITIALIZE).status_code == 200
            rebound = raw(server, "POST", dict(MCP_HEADERS, Host="attacker.example", **auth),
                          INITIALIZE)
            assert rebound.status_code == 421  # a token does not make another Host fine
    finally:
        with_token.stop()
        without.stop()


async def test_own_origin_is_accepted_with_empty_allowed_origins(harness: Harness) -> None:
    """#23 item 13: with `allowed_origins = []` the gateway's own address is a fine Origin
    (the MCP conformance suite's DNS-rebinding scenario sends it); every other is refused."""
    port = free_port()
    server = start_http_server(harness.home, harness.write_config({}), port)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                    f"http://127.0.0.1:{port}/"):
            answer = raw(server, "POST", dict(MCP_HEADERS, Origin=own, **auth), INITIALIZE)
            assert answer.status_code == 200, (own, answer.text)
        for foreign in (f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}",
                        f"http://attacker.example:{port}", "http://127.0.0.1", "null",
                        f"http://127.0.0.2:{port}", f"127.0.0.1:{port}"):
            answer = raw(server, "POST", dict(MCP_HEADERS, Origin=foreign, **auth), INITIALIZE)
            assert answer.status_code == 403, (foreign, answer.text)
            assert answer.json()["error"] == "forbidden_origin"
    finally:
        server.stop()


async def test_bearer_scheme_is_case_insensitive(harness: Harness) -> None:
    # Three sessions opened back to back: more than the small fixture's cap lets in (a
    # session younger than the eviction floor is never evicted).
    server = harness.http_server({"http": {"max_sessions": 5}})
    for scheme in ("bearer", "BEARER", "BeArEr"):
        answer = raw(server, "POST", dict(MCP_HEADERS, Authorization=f"{scheme} {TOKEN}"),
                     INITIALIZE)
        assert answer.status_code == 200, scheme
    for wrong in (f"Basic {TOKEN}", f"Bearer{TOKEN}", TOKEN):
        answer = raw(server, "POST", dict(MCP_HEADERS, Authorization=wrong), INITIALIZE)
        assert answer.status_code == 401, wrong
