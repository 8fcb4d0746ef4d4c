"""Streamable HTTP transport: bearer auth, body cap, session cap and /healthz.

One Gateway (job manager and lease tasks) serves every HTTP session of the process: the
app's lifespan runs the SDK session manager, whose single entry into the MCP lifespan
starts and stops it. The guard is a pure ASGI wrapper (streaming responses pass through
untouched) that answers before the SDK sees the request:
- 401 with `WWW-Authenticate: Bearer` unless the Authorization header carries the token
  (compared in constant time);
- 413 when Content-Length exceeds `http.max_body_bytes` (the SDK also caps streamed bodies);
- 429 with Retry-After when `http.max_sessions` sessions are open (the SDK refuses with 503;
  a full server is a "come back later", which clients retry, not a server fault).
`GET /healthz` needs no token and says only whether the gateway is ready and admitting.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import Settings
from gateway.mcp.server import GatewayServer, build_server

log = structlog.get_logger(__name__)

HEALTH_PATH = "/healthz"
SESSION_RETRY_AFTER_S = 5  # a session slot frees when a client disconnects or idles out
# Open SSE streams must not hold shutdown past the drain budget (uvicorn takes whole seconds).
GRACEFUL_SHUTDOWN_S = 2
SESSION_HEADER = b"mcp-session-id"


def build_http_app(settings: Settings, host: str,
                   token: str | None) -> tuple[ASGIApp, GatewayServer]:
    """The ASGI app serving MCP at `settings.http.path` plus /healthz, behind the guard."""
    server = build_server(settings, role="http")
    state = server.state

    async def healthz(_request: Request) -> Response:
        manager = state.ready_manager()
        admitting = bool(manager.snapshot()["admitting"]) if manager is not None else False
        return JSONResponse({"ok": True, "ready": manager is not None, "admitting": admitting})

    server.custom_route(HEALTH_PATH, methods=["GET"])(healthz)
    app = server.streamable_http_app(
        streamable_http_path=settings.http.path,
        max_request_body_size=settings.http.max_body_bytes,
        max_sessions=settings.http.max_sessions,
        host=host,
    )
    return HttpGuard(app, token=token, max_body_bytes=settings.http.max_body_bytes), server


class HttpGuard:
    """Auth, body cap and session-cap translation in front of the SDK's app."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._expected is not None:
            given = headers.get(b"authorization", b"")
            # Constant time: the comparison must not leak how much of a guess was right.
            if not hmac.compare_digest(given, self._expected):
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
        if scope.get("method") == "POST" and SESSION_HEADER not in headers:
            await self.app(scope, receive, _session_cap_as_429(send))
            return
        await self.app(scope, receive, send)


def _session_cap_as_429(send: Send) -> Send:
    """Rewrite the SDK's 503 "Too many open sessions" for a new session into a 429."""
    rewriting = False

    async def wrapped(message: Message) -> None:
        nonlocal rewriting
        if message["type"] == "http.response.start" and message["status"] == 503:
            rewriting = True
            log.warning("HTTP session limit reached", action="session_cap")
            body = json.dumps({"error": "session_capacity", "retryable": True,
                               "message": "the gateway is at its HTTP session limit "
                                          "(http.max_sessions); retry shortly"}).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(SESSION_RETRY_AFTER_S).encode()),
            ]})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if rewriting:
            return  # the SDK's own 503 body is replaced by ours
        await send(message)

    return wrapped


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


async def serve_http(settings: Settings, host: str, port: int, token: str | None) -> int:
    """Serve Streamable HTTP until SIGTERM/SIGINT (uvicorn handles them gracefully: the
    app lifespan then drains the gateway)."""
    import uvicorn

    app, _server = build_http_app(settings, host, token)
    if token is None:
        log.warning("HTTP transport without authentication (loopback only)", action="serve",
                    host=host, port=port)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            server_header=False)
    await uvicorn.Server(config).serve()
    return 0
