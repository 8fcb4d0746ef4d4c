"""`agent-cli-gateway dashboard`: the dashboard on a listener of its own.

On loopback (the default) it makes a one-time token and prints the address that carries it;
on another address it takes `[http] auth_token` (the caller checked one is set) and prints
the address without it: a long-lived secret never goes to a terminal's scrollback. The
socket is bound before anything is printed, so `--port 0` prints the port it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from gateway.config import Settings
from gateway.dashboard.app import DashboardOptions, build_dashboard_app
from gateway.dashboard.auth import TOKEN_PARAM, Sessions, new_token
from gateway.store import open_store
from gateway.store.base import JobStore
from neutral.host_origin import HostOriginRule, host_literal
from neutral.loopback import is_loopback_host

# Open event streams must not hold a Ctrl-C past this (uvicorn takes whole seconds).
GRACEFUL_SHUTDOWN_S = 1


@dataclass(frozen=True, slots=True)
class DashboardRun:
    host: str
    port: int
    allow_actions: bool = False
    open_browser: bool = False
    token: str | None = None  # None: a one-time token is made (loopback only)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve_dashboard(settings: Settings, run: DashboardRun,
                          announce: Callable[[str], None]) -> int:
    """Serve until SIGINT/SIGTERM. `announce` gets the line with the address to open.
    Raises OSError when the address cannot be bound, StoreUnavailable when the store
    cannot be opened."""
    one_time = run.token is None
    if one_time and not is_loopback_host(run.host):
        raise ValueError("a dashboard off loopback needs a fixed token")
    token = run.token or new_token()
    store: JobStore = await open_store(settings, role="dashboard")
    try:
        # uvicorn serves on the socket but leaves it open: closed here, whatever ends the serve.
        with _bind(run.host, run.port) as sock:
            return await _serve_on(sock, settings, store, run, token, announce)
    finally:
        await store.close()


async def _serve_on(sock: socket.socket, settings: Settings, store: JobStore,
                    run: DashboardRun, token: str, announce: Callable[[str], None]) -> int:
    """The dashboard app on `sock`, its address announced, served until a stop signal."""
    one_time = run.token is None
    port = sock.getsockname()[1]

    async def the_store() -> JobStore:
        return store

    options = DashboardOptions(settings=settings, store=the_store,
                               sessions=Sessions(token, one_time=one_time),
                               allow_actions=run.allow_actions)
    app = build_dashboard_app(options, HostOriginRule.of(run.host,
                                                         settings.http.allowed_origins))
    address = f"http://{host_literal(run.host)}:{port}/"
    url = f"{address}?{TOKEN_PARAM}={token}" if one_time else address
    announce(url if one_time else
             f"{address}?{TOKEN_PARAM}=<[http] auth_token>  (the token is not printed)")
    if run.open_browser and one_time:
        with contextlib.suppress(webbrowser.Error):
            await asyncio.to_thread(webbrowser.open, url)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            server_header=False)
    await uvicorn.Server(config).serve(sockets=[sock])
    return 0
