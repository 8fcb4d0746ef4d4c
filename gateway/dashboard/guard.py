"""What every dashboard response passes: the Host/Origin rule of every HTTP listener of the
gateway (neutral/host_origin.py, the one home of it), and the security headers.

The Content-Security-Policy allows the dashboard's own script and stylesheet and nothing
inline: a string from a CLI or a prompt that slipped past the escaping still could not run.
"""

from __future__ import annotations

import time

import structlog
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from neutral.host_origin import HostOriginRule

log = structlog.get_logger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    # A token in an address never leaves in a Referer to another site; same-origin rather
    # than no-referrer, under which Chromium sends `Origin: null` with a form POST.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),  # pages hold job data: no copy on disk
)


def with_security_headers(send: Send) -> Send:
    """The security headers on the answer, and `Server-Timing: app;dur=MS`: how long the
    server took until the answer's head (a page is rendered whole before it), which
    bench/bench_dashboard.py reads."""
    started = time.perf_counter()

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            names = {name.lower() for name, _ in message.get("headers") or []}
            extra = [(n, v) for n, v in SECURITY_HEADERS if n not in names]
            took_ms = (time.perf_counter() - started) * 1000
            extra.append((b"server-timing", f"app;dur={took_ms:.1f}".encode()))
            message = {**message, "headers": [*(message.get("headers") or []), *extra]}
        await send(message)

    return wrapped


class DashboardGuard:
    """Host/Origin (421/403), then the app with the security headers on every answer.

    `prefix` is where the dashboard is mounted (`/ui` under serve, "" on its own): the app
    sees paths without it."""

    def __init__(self, app: ASGIApp, rule: HostOriginRule | None, prefix: str = "") -> None:
        self.app = app
        self.rule = rule  # None: the caller (serve's HttpGuard) checked Host/Origin already
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = with_security_headers(send)
        if self.rule is not None:
            headers = dict(scope.get("headers") or [])
            server = scope.get("server") or (None, None)
            origin = headers.get(b"origin")
            refusal = self.rule.refusal((server[0], server[1]),
                                        headers.get(b"host", b"").decode("latin-1"),
                                        None if origin is None else origin.decode("latin-1"))
            if refusal is not None:
                log.warning("dashboard refused a request", action=f"{refusal}_refused")
                status, text = ((421, "the Host header must name this dashboard's address")
                                if refusal == "host" else
                                (403, "this Origin may not call the dashboard"))
                await PlainTextResponse(text, status_code=status)(scope, receive, send)
                return
        if self.prefix:
            path = scope.get("path", "")
            inner = path[len(self.prefix):] or "/"
            scope = {**scope, "path": inner, "raw_path": inner.encode(), "root_path": ""}
        await self.app(scope, receive, send)
