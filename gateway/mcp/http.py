"""Streamable HTTP transport: Host/Origin, bearer auth, body cap, sessions and /healthz.

One Gateway (job manager and lease tasks) serves every HTTP session of the process: the
app's lifespan runs the SDK session manager, whose single entry into the MCP lifespan
starts and stops it. The guard is a pure ASGI wrapper (streaming responses pass through
untouched) that answers before the SDK sees the request:
- 421 unless the Host header names the bound address and port, 403 for an Origin header that
  is neither the gateway's own (`http://` plus a Host value it accepts) nor in
  `http.allowed_origins` (DNS rebinding: a web page's script must never reach a loopback
  gateway under an attacker's name). The SDK guards only the literal 127.0.0.1, localhost
  and ::1, so its own check is off and this one covers every address, token or not;
- 401 with `WWW-Authenticate: Bearer` unless the Authorization header carries the token
  (scheme case-insensitive per RFC 7235, token compared in constant time);
- 413 when Content-Length exceeds `http.max_body_bytes` (the SDK also caps streamed bodies);
- at `http.max_sessions` open sessions, an `initialize` closes the least recently used
  session idle past the eviction floor to make room (sessions.py); 429 with Retry-After
  only when none can give way (the SDK refuses with 503; a full server is a "come back
  later", which clients retry, not a server fault), saying when one will (sessions.py
  `retry_after_s`).
A request that is JSON but not valid Unicode (a lone surrogate) gets a parse error for its
own id (unicode_errors.py), not the SDK's `id: null`.
`GET /healthz` needs no token and says only whether the gateway is ready and admitting.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

import structlog
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import Settings
from gateway.dashboard.app import DashboardOptions, build_dashboard_app
from gateway.dashboard.auth import Sessions
from gateway.mcp.principal import principal_of
from gateway.mcp.server import GatewayServer, build_server
from gateway.mcp.server_state import ServerState
from gateway.mcp.sessions import SessionTable, opens_a_session
from gateway.mcp.unicode_errors import rewrite_parse_error
from gateway.store.base import JobStore, StoreUnavailable

if TYPE_CHECKING:  # the job machinery loads with the gateway, not with this module
    from gateway.jobs.claims import CapabilityReader
from neutral.host_origin import HostOriginRule

log = structlog.get_logger(__name__)

HEALTH_PATH = "/healthz"
UI_PATH = "/ui"  # the dashboard (gateway/dashboard/): its own token-to-cookie exchange
# Open SSE streams must not hold shutdown past the drain budget (uvicorn takes whole seconds).
GRACEFUL_SHUTDOWN_S = 2
SESSION_HEADER = b"mcp-session-id"
# The SDK's own Host/Origin check knows only the literal loopback names; ours replaces it.
SDK_HOST_CHECK_OFF = TransportSecuritySettings(enable_dns_rebinding_protection=False)


def build_http_app(settings: Settings, host: str, token: str | None,
                   read_capabilities: CapabilityReader | None = None,
                   ) -> tuple[ASGIApp, GatewayServer]:
    """The ASGI app serving MCP at `settings.http.path` plus /healthz, behind the guard."""
    server = build_server(settings, role="http", read_capabilities=read_capabilities)
    state = server.state
    state.principal = principal_of(token)  # its callers: whoever holds this token

    async def healthz(_request: Request) -> Response:
        manager = state.ready_manager()
        admitting = bool(manager.snapshot()["admitting"]) if manager is not None else False
        return JSONResponse({"ok": True, "ready": manager is not None, "admitting": admitting})

    server.custom_route(HEALTH_PATH, methods=["GET"])(healthz)
    app = server.streamable_http_app(
        streamable_http_path=settings.http.path,
        max_request_body_size=settings.http.max_body_bytes,
        max_sessions=settings.http.max_sessions,
        session_idle_timeout=settings.http.session_idle_timeout_s,
        transport_security=SDK_HOST_CHECK_OFF,
        host=host,
    )
    guard = HttpGuard(app, token=token, ui=_dashboard(settings, state, token),
                      max_body_bytes=settings.http.max_body_bytes,
                      host=host, allowed_origins=settings.http.allowed_origins,
                      sessions=SessionTable(
                          server.session_manager,
                          session_idle_timeout_s=settings.http.session_idle_timeout_s),
                      max_sessions=settings.http.max_sessions)
    return guard, server


class HttpGuard:
    """Host/Origin, auth, body cap and session admission in front of the SDK's app."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int, host: str,
                 ui: ASGIApp | None = None,
                 allowed_origins: list[str], sessions: SessionTable,
                 max_sessions: int) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.host = host
        self.rule = HostOriginRule.of(host, allowed_origins)
        self.ui = ui
        self.sessions = sessions
        self.max_sessions = max_sessions

    def _host_refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> Response | None:
        """421/403 for a Host or Origin that is not this gateway's (DNS rebinding)."""
        server = scope.get("server") or (None, None)
        origin = headers.get(b"origin")
        refusal = self.rule.refusal((server[0], server[1]),
                                    headers.get(b"host", b"").decode("latin-1"),
                                    None if origin is None else origin.decode("latin-1"))
        if refusal == "host":
            given = headers.get(b"host", b"").decode("latin-1").strip().lower()
            log.warning("refused a request for another host", action="host_refused",
                        host=given[:100])
            return _json(421, {"error": "misdirected_request",
                               "message": f"the Host header must name this gateway's "
                                          f"address ({self.host}:{server[1]})"})
        if refusal == "origin":
            log.warning("refused a request from a foreign origin", action="origin_refused",
                        origin=(origin or b"").decode("latin-1")[:100])
            return _json(403, {"error": "forbidden_origin",
                               "message": "this Origin is not allowed; list it in "
                                          "[http] allowed_origins to let it call"})
        return None

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self._token is None:
            return True
        scheme, _, credentials = headers.get(b"authorization", b"").strip().partition(b" ")
        # Schemes are case-insensitive (RFC 7235 section 2.1); constant time: the comparison
        # must not leak how much of a guess was right.
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(),
                                                                   self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        refusal = self._host_refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if scope.get("path") == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        path = scope.get("path") or ""
        if self.ui is not None and (path == UI_PATH or path.startswith(UI_PATH + "/")):
            await self.ui(scope, receive, send)  # its own token-to-cookie exchange
            return
        if not self._authorized(headers):
            await _json(401, {"error": "unauthorized",
                              "message": "a valid 'Authorization: Bearer <token>' header "
                                         "is required"},
                        {"WWW-Authenticate": 'Bearer realm="agent-cli-gateway"'},
                        )(scope, receive, send)
            return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                too_big = False
            if too_big:
                await _json(413, {"error": "request_too_large",
                                  "message": f"request bodies are limited to "
                                             f"{self.max_body_bytes} bytes (http.max_body_bytes)"},
                            )(scope, receive, send)
                return
        if scope.get("method") == "POST":
            receive, send = rewrite_parse_error(receive, send)
        session_id = headers.get(SESSION_HEADER)
        if session_id is not None:
            with self.sessions.request(session_id.decode("latin-1")):
                await self.app(scope, receive, send)
            return
        if scope.get("method") == "POST":
            if self.sessions.at_cap(self.max_sessions):
                body, receive = await _buffered(receive, self.max_body_bytes)
                if opens_a_session(body) and not await self.sessions.make_room(
                        self.max_sessions):
                    log.warning("HTTP session limit reached, every session busy",
                                action="session_cap")
            await self.app(scope, receive, _opening_response(send, self.sessions))
            return
        await self.app(scope, receive, send)


async def _buffered(receive: Receive, limit: int) -> tuple[bytes, Receive]:
    """Read a request body (at most `limit` + 1 bytes: more is not a session's opening
    request, and the SDK refuses it) and a receive that replays it to the app."""
    messages: list[Message] = []
    size = 0
    while size <= limit:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    replay = iter(messages)

    async def replaying() -> Message:
        for message in replay:
            return message
        return await receive()

    return (body if size <= limit else b""), replaying


def _opening_response(send: Send, sessions: SessionTable) -> Send:
    """Note the id of a session the SDK opens; rewrite its 503 "Too many open sessions" for
    a new session into a 429."""
    rewriting = False

    async def wrapped(message: Message) -> None:
        nonlocal rewriting
        if message["type"] == "http.response.start" and message["status"] != 503:
            for name, value in message.get("headers") or []:
                if name.lower() == SESSION_HEADER:
                    sessions.opened(value.decode("latin-1"))
        if message["type"] == "http.response.start" and message["status"] == 503:
            rewriting = True
            retry_after_s = sessions.retry_after_s()
            body = json.dumps({"error": "session_capacity", "retryable": True,
                               "retry_after_s": retry_after_s,
                               "message": f"the gateway is at its HTTP session limit "
                                          f"(http.max_sessions); retry in {retry_after_s} s, "
                                          f"when a session can give way"}).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after_s).encode()),
            ]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if rewriting:
            return  # the SDK's own 503 body is replaced by ours
        await send(message)

    return wrapped


def _dashboard(settings: Settings, state: ServerState, token: str | None) -> ASGIApp:
    """The dashboard at /ui, over this gateway's own store, read-only; its token is the
    transport's bearer token, traded for a session cookie (a browser sends no header)."""

    async def store() -> JobStore:
        manager = state.ready_manager()
        if manager is None:
            raise StoreUnavailable("the gateway is starting or stopping")
        found: JobStore = manager.store
        return found

    options = DashboardOptions(settings=settings, store=store,
                               sessions=Sessions(token, one_time=False), prefix=UI_PATH)
    return build_dashboard_app(options, None)  # Host/Origin: HttpGuard checked them


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


async def serve_http(settings: Settings, host: str, port: int, token: str | None,
                     read_capabilities: CapabilityReader | None = None) -> int:
    """Serve Streamable HTTP until SIGTERM/SIGINT (uvicorn handles them gracefully: the
    app lifespan then drains the gateway)."""
    app, _server = build_http_app(settings, host, token, read_capabilities)
    if token is None:
        log.warning("HTTP transport without authentication (loopback only)", action="serve",
                    host=host, port=port)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            server_header=False)
    await uvicorn.Server(config).serve()
    return 0
