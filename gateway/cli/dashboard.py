"""`dashboard [--host H] [--port P] [--open] [--allow-actions]`: the web dashboard over the
store (gateway/dashboard/). Read-only unless --allow-actions; loopback unless --host names
another address and `[http] auth_token` is set."""

from __future__ import annotations

import argparse

import anyio

from gateway.cli.arguments import CommandTree, port
from gateway.cli.common import EXIT_USAGE, CliError, command, store_settings
from neutral.loopback import is_loopback_host

DEFAULT_HOST = "127.0.0.1"


def add_parsers(tree: CommandTree) -> None:
    dashboard = tree.add(
        "dashboard", help="a web page of the jobs, usage and gateways of the store",
        description="Serve the dashboard: jobs (live), each job's output, result and "
                    "changes, usage charts and the gateway instances of every gateway "
                    "sharing the store. Prints an address with a one-time token.")
    dashboard.add_argument("--host", default=DEFAULT_HOST,
                           help="bind address (default: 127.0.0.1; another address needs "
                                "[http] auth_token)")
    dashboard.add_argument("--port", type=port, default=0, help="port (default: any free one)")
    dashboard.add_argument("--open", action="store_true", help="open it in a browser")
    dashboard.add_argument("--allow-actions", action="store_true",
                           help="let the page cancel jobs and apply or discard their changes")
    dashboard.set_defaults(handler=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    settings = store_settings(args)
    if settings is None:
        raise CliError(f"the job store has not been created yet: start a gateway first "
                       f"(`{command()} serve`), then the dashboard")
    token = None
    if not is_loopback_host(args.host):
        token = settings.http.auth_token
        if not token:
            raise CliError(f"a dashboard on {args.host!r} (not loopback) needs a token: set "
                           f"[http] auth_token (or AGENT_GATEWAY_HTTP__AUTH_TOKEN)",
                           EXIT_USAGE)
    # starlette, uvicorn and Jinja2: only this command loads them.
    from gateway.dashboard.serve import DashboardRun, serve_dashboard  # deferred: start-up

    run = DashboardRun(host=args.host, port=args.port, allow_actions=args.allow_actions,
                       open_browser=args.open, token=token)

    def announce(line: str) -> None:
        print(f"Dashboard: {line}", flush=True)
        print("Ctrl-C stops it.", flush=True)

    try:
        return anyio.run(serve_dashboard, settings, run, announce)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
