"""Serving MCP: stdio (the default) or Streamable HTTP, with the gateway's signal handling.

Kept apart from `server.py` so that the HTTP app (`http.py`) and the stdio loop both build on
the server without the server knowing either: the import graph has no cycle.
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING

import structlog
from mcp.server.stdio import stdio_server

from gateway.config import ConfigError, Settings
from gateway.logs import configure_logging
from gateway.mcp.server import GatewayServer, build_server
from gateway.mcp.unicode_errors import answer_unparsable

if TYPE_CHECKING:  # the job machinery loads with the gateway, not with this module
    from gateway.jobs.claims import CapabilityReader
from neutral.loopback import is_loopback_host

log = structlog.get_logger(__name__)


class ServeError(ValueError):
    """serve() was asked for something unsafe or impossible; the message says what to do."""


def serve(settings: Settings, transport: str = "stdio", host: str | None = None,
          port: int | None = None, no_auth: bool = False,
          read_capabilities: CapabilityReader | None = None) -> int:
    """Serve MCP until the client goes away or a signal arrives; returns an exit code.

    `read_capabilities`: this gateway also claims the queued jobs of other hosts it meets
    (`[worker] accept_remote` on PostgreSQL), publishing what it reads.

    Raises ServeError for an unknown transport, HTTP without a token (unless no_auth on a
    loopback host), or no_auth on a non-loopback host.
    """
    if transport == "stdio":
        return asyncio.run(serve_stdio(settings, read_capabilities))
    if transport == "http":
        # Only an HTTP gateway loads its app.
        from gateway.mcp.http import serve_http  # deferred: start-up

        host = host if host is not None else settings.http.host
        port = port if port is not None else settings.http.port
        token = settings.http.auth_token
        if no_auth and not is_loopback_host(host):
            raise ServeError(f"no_auth is only allowed on a loopback host (127.0.0.1, ::1, "
                             f"localhost), not {host!r}; configure [http] auth_token instead.")
        if not no_auth and not token:
            raise ServeError("serving MCP over HTTP needs a bearer token: set [http] auth_token "
                             "in the config or the AGENT_GATEWAY_HTTP__AUTH_TOKEN environment "
                             "variable (or, on a loopback host only, pass --no-auth).")
        return asyncio.run(serve_http(settings, host, port, None if no_auth else token,
                                      read_capabilities))
    raise ServeError(f"unknown transport {transport!r}; use 'stdio' or 'http'.")


def serve_broken_setup(error: ConfigError) -> int:
    """Serve MCP over stdio with a configuration that could not be loaded: the handshake
    succeeds and every tool answers `setup_error` with the exact problem and its fix."""
    problems = "; ".join(error.problems)
    check = ("the variables are read from the environment the gateway starts in, so fix "
             "them where the MCP client's config sets them (`agent-cli-gateway doctor` run "
             "from another shell does not see them)" if error.env_names else
             "`agent-cli-gateway doctor` checks the file")
    return serve_setup_error(
        f"The gateway cannot start: {error.source} is invalid: {problems}. Fix it "
        f"(every key is in config.example.toml; {check}), then restart the gateway "
        f"(reconnect the MCP server in your client). This will not pass by itself.")


def serve_setup_error(message: str) -> int:
    """Serve MCP over stdio where the gateway cannot run (a broken config, a system without
    the POSIX process model): the handshake succeeds and every tool answers `message` as
    `setup_error`. No store is opened and no process is started."""
    configure_logging("info", "auto")  # the config's own choice is unreadable (or unread)
    server = build_server(Settings.model_construct(), role="stdio", setup_error=message)
    return asyncio.run(_serve_server_stdio(server))


async def run_stdio(server: GatewayServer) -> None:
    """The SDK's `run_stdio_async`, but reading stdin and writing stdout on the loop
    (stdio.py): cancelling it then really ends serving, a request and its answer cost no
    thread hop, and a request the SDK cannot parse but whose id is known is answered
    (unicode_errors.py). fd 1 points at stderr while serving, so stray writes never reach
    the wire."""
    # Only a stdio gateway loads its streams.
    from gateway.mcp.stdio import LoopStdin, LoopStdout  # deferred: start-up

    stdin = LoopStdin()
    stdout = LoopStdout()
    lowlevel = server.lowlevel
    try:
        await stdin.open()
        await stdout.open()
        async with (
            stdio_server(stdin=stdin, stdout=stdout) as (  # type: ignore[arg-type]
                read_stream, write_stream),
            answer_unparsable(read_stream, write_stream) as parsed_stream,
        ):
            await lowlevel.run(parsed_stream, write_stream,
                               lowlevel.create_initialization_options())
    finally:
        stdin.restore()
        stdout.close()


async def serve_stdio(settings: Settings,
                      read_capabilities: CapabilityReader | None = None) -> int:
    """MCP over stdin/stdout. SIGTERM/SIGINT cancel the serving task, so the lifespan's
    drain runs exactly as on stdin EOF."""
    return await _serve_server_stdio(build_server(settings, role="stdio",
                                                  read_capabilities=read_capabilities))


async def _serve_server_stdio(server: GatewayServer) -> int:
    serving = asyncio.create_task(run_stdio(server), name="mcp_stdio")
    stopped_by: list[int] = []

    def on_signal(signum: int) -> None:
        # Only the first signal cancels: a second one (an impatient client, a double
        # Ctrl-C) must not interrupt the drain, which is bounded anyway.
        name = signal.Signals(signum).name
        if stopped_by:
            log.info("signal received while shutting down; drain continues", action="signal",
                     signal=name)
            return
        log.info("signal received; shutting down", action="signal", signal=name)
        stopped_by.append(signum)
        serving.cancel()

    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except NotImplementedError:  # a loop without signal handlers (native Windows)
            continue
        handled.append(signum)
    try:
        await serving
    except asyncio.CancelledError:
        if not stopped_by:
            raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
            # Handled until the process has exited: a late SIGTERM (Claude Code sends one
            # 100 ms after its SIGINT) must not cut the interpreter's teardown short.
            signal.signal(signum, signal.SIG_IGN)
    return 0
