"""The operator's command line: argparse and dispatch, plus `serve` and `init`.

The commands live by concern: jobs.py (`jobs ...`), tail.py (`jobs tail`), run.py (`run`),
instances.py, doctor.py; each adds its own parsers (`add_parsers`, COMMAND_MODULES below, on
the tree of arguments.py); common.py has the exit codes, format.py the tables and times.
Exit codes (common.py): 0 success, 1 failure, 2 usage or configuration error, 130
interrupted; the commands that follow a job report how it ended (JOB_EXIT_CODES). A bad
config prints one line per problem and never a traceback; an unexpected error prints one
line (a traceback only with --debug or `logging.level = "debug"`).

`serve` prints nothing at all to stdout: there, stdout is the MCP stdio channel. The other
commands talk to a human on stdout and put errors on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from gateway import platform, proc
from gateway.cli.arguments import CommandTree, Parser, port
from gateway.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    command,
    error,
    invocation,
    load,
)
from gateway.cli.version import PROG, version_line
from gateway.config import ConfigError, default_config_path, unknown_env_warnings
from gateway.fs import ensure_private_dir, write_private_atomically
from gateway.platform import ENV_VAR as PLATFORM_ENV
from gateway.platform import UnknownPlatform
from neutral.loopback import is_loopback_host

CONFIG_FILE_MODE = 0o600
# What `init` writes: the example config, at the repository's root and inside the wheel.
EXAMPLE_CONFIG = "config.example.toml"
TOKEN_HOWTO = (
    "set [http] auth_token in the config file or the AGENT_GATEWAY_HTTP__AUTH_TOKEN environment "
    "variable (for example: export AGENT_GATEWAY_HTTP__AUTH_TOKEN=\"$(openssl rand -hex 32)\")"
)
def stdio_hint() -> str:
    """What `serve` says when a person, not a client, is at its stdin: how to add it to a
    client, in the form that runs from where it runs (a checkout: `uv run --directory`)."""
    argv = invocation()
    server = json.dumps({"command": argv[0], "args": list(argv[1:])} if len(argv) > 1
                        else {"command": argv[0]})
    return (f"{PROG}: this is an MCP server speaking JSON-RPC on stdin/stdout; it waits for an "
            f"MCP client, not for typing. Add it to a client instead, e.g.\n"
            f"  claude mcp add agent-cli-gateway -- {command()}\n"
            f"  codex mcp add agent-cli-gateway -- {command()}\n"
            f"or in a client's JSON config: \"mcpServers\": {{\"agent-cli-gateway\": "
            f"{server}}}. Check the setup with `{command()} doctor`; try a provider from the "
            f"shell with `{command()} run PROVIDER PROMPT`. Ctrl-D or Ctrl-C stops it.")


# -- parser --------------------------------------------------------------------------------


# Each adds its commands (`add_parsers`), in the order `--help` lists them, after serve and
# init (this module's). Imported only for a command line that may name one of them: serving,
# the default, builds serve's own parser, and an MCP client's first answer does not wait for
# every command's imports (the worktree machinery among them).
COMMAND_MODULES = ("doctor", "run", "instances", "notices", "usage", "finalize", "jobs",
                   "worktrees", "dashboard", "worker", "attempts", "config_show")


def serves(argv: list[str]) -> bool:
    """Whether `argv` asks for `serve` (named, or no command at all) and no help: then the
    other commands' parsers are not needed. Anything but `--config PATH`, `--config=PATH` and
    `--debug` before the command is left to the whole parser (its errors, its help)."""
    tokens = iter(argv)
    for token in tokens:
        if token == "serve":
            return True
        if token == "--config":
            next(tokens, None)  # its value, whatever it reads
        elif token != "--debug" and not token.startswith("--config="):
            return False  # another command, --help, --version, or a mistake
    return True


def build_parser(*, commands: bool = True) -> argparse.ArgumentParser:
    """The command tree, whole (`commands`), or serve and init only. `--config` and
    `--debug` work before or after the command."""
    # On subcommands these default to SUPPRESS so they never overwrite a value given before
    # the subcommand name (`agent-cli-gateway --config X doctor`).
    common = Parser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help="config file (default: $AGENT_GATEWAY_CONFIG or "
                             "~/.agent-cli-gateway/config.toml)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging and full tracebacks")

    parser = Parser(
        prog=PROG,
        description="MCP server that runs coding-agent CLIs and model APIs as durable jobs. "
                    "Without a command it serves MCP over stdio.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--config", type=Path, default=None, metavar="PATH",
                        help="config file (default: $AGENT_GATEWAY_CONFIG or "
                             "~/.agent-cli-gateway/config.toml)")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="debug logging and full tracebacks")
    parser.set_defaults(handler=cmd_serve, transport="stdio", host=None, port=None,
                        no_auth=False)
    tree = CommandTree(parser.add_subparsers(dest="command", metavar="COMMAND"), common)
    _add_parsers(tree)
    for name in COMMAND_MODULES if commands else ():
        importlib.import_module(f"gateway.cli.{name}").add_parsers(tree)
    return parser


def _add_parsers(tree: CommandTree) -> None:
    """This module's commands: `serve` and `init`."""
    serve = tree.add("serve", help="serve MCP (the default)",
                     description="Serve MCP. Logs go to stderr; stdout is the stdio channel.")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", help="HTTP bind address (default: [http] host)")
    serve.add_argument("--port", type=port, help="HTTP port (default: [http] port)")
    serve.add_argument("--no-auth", action="store_true",
                       help="HTTP without a bearer token; only allowed on a loopback host")
    serve.set_defaults(handler=cmd_serve)

    init = tree.add("init", help="write a starting config file",
                    description="Write a commented starting config (mode 0600).")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=cmd_init)


# -- entry point ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (never raises, never a bare traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(commands=not serves(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse reported
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        if args.command != "serve":  # serve answers it as every tool's setup_error
            platform.choose()
        return handler(args)
    except ConfigError as exc:
        error(str(exc))
        return EXIT_USAGE
    except UnknownPlatform as exc:  # the environment names no platform: a config error
        error(str(ConfigError(None, [str(exc)], [PLATFORM_ENV], in_file=False)))
        return EXIT_USAGE
    except CliError as exc:
        error(str(exc))
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        # Imported here: serving must not load the store's modules before its first answer.
        from gateway.store.base import StoreUnavailable  # deferred: start-up

        if args.debug:
            traceback.print_exc(file=sys.stderr)
        if isinstance(exc, StoreUnavailable):
            error(f"the job store is unavailable: {exc}")
        else:
            error(f"error: {type(exc).__name__}: {exc}")
        return EXIT_FAILURE


# -- serve ---------------------------------------------------------------------------------

# The secret settings a gateway reads from its environment once, at start (then they leave
# it: gateway.proc.keep_secrets_from_children). PGPASSWORD and API keys are read at each use.
SETTINGS_SECRET_ENV = ("AGENT_GATEWAY_HTTP__AUTH_TOKEN", "AGENT_GATEWAY_PERSISTENCE__DSN")


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve MCP. Everything this prints goes to stderr: stdout is the protocol channel."""
    problem = platform.setup_problem()  # no POSIX process model, a bad AGENT_GATEWAY_PLATFORM
    if problem is not None:
        if args.transport != "stdio":
            raise CliError(problem, EXIT_FAILURE)
        error(problem)
        # The CLI must not import the MCP SDK: only `serve` loads it.
        from gateway.mcp.serve import serve_setup_error  # deferred: start-up

        return serve_setup_error(problem)
    try:
        settings = load(args, quiet=False)
    except ConfigError as exc:
        if args.transport != "stdio":
            raise  # an operator started it by hand and reads this message
        # An MCP client that sees the server exit before the handshake shows only
        # "connection closed": serve anyway, and let every tool say what is wrong.
        error(str(exc))
        for warning in unknown_env_warnings(os.environ):  # often the cause: a typo'd name
            error(f"warning: {warning}")
        # The CLI must not import the MCP SDK: only `serve` loads it.
        from gateway.mcp.serve import serve_broken_setup  # deferred: start-up

        return serve_broken_setup(exc)
    # Read into the settings: from here nothing reads them from the environment again.
    proc.keep_secrets_from_children(SETTINGS_SECRET_ENV)
    host = args.host if args.host is not None else settings.http.host
    port = args.port if args.port is not None else settings.http.port
    if args.no_auth and not is_loopback_host(host):
        raise CliError(
            f"--no-auth is only allowed on a loopback host (127.0.0.1, ::1, localhost), not "
            f"{host!r}: anyone who can reach {host}:{port} could run agents as you. "
            f"Use a token instead: {TOKEN_HOWTO}", EXIT_USAGE)
    if args.transport == "http" and not args.no_auth and not settings.http.auth_token:
        raise CliError(f"serving over HTTP needs a bearer token: {TOKEN_HOWTO}; or, on a "
                       f"loopback host only, pass --no-auth", EXIT_USAGE)
    from gateway.mcp.serve import serve  # deferred: start-up (the CLI must not import the MCP SDK)

    if args.transport == "stdio" and _isatty(sys.stdin):
        print(stdio_hint(), file=sys.stderr)  # stderr: stdout is the protocol channel

    read_capabilities = None
    if settings.claims_remote:
        from gateway.cli.worker import capability_reader  # deferred: start-up

        read_capabilities = capability_reader(settings)
    return serve(settings, transport=args.transport, host=host, port=port,
                 no_auth=args.no_auth, read_capabilities=read_capabilities)


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


# -- init ----------------------------------------------------------------------------------


def example_config_text() -> str:
    """The commented starting config: config.example.toml, the repository's one copy. The
    wheel carries it inside the package (pyproject: force-include); run from a checkout,
    the package has none and the file is read at the repository's root."""
    packaged = resources.files("gateway").joinpath(EXAMPLE_CONFIG)
    if packaged.is_file():
        return packaged.read_text("utf-8")
    return (Path(__file__).resolve().parents[2] / EXAMPLE_CONFIG).read_text("utf-8")


def cmd_init(args: argparse.Namespace) -> int:
    path: Path = (args.config or default_config_path()).expanduser()
    write_private_file(path, example_config_text(), overwrite=args.force)
    print(f"Wrote a starting config to {path} (mode 0600).")
    print(f"Every value in it is the default; edit it, then check it with: {command()} doctor")
    return EXIT_OK


def write_private_file(path: Path, text: str, *, overwrite: bool) -> None:
    """Write `text` to `path` readable by the owner only; create the directory 0700.

    Without `overwrite` an existing file is never touched (O_EXCL: no check-then-write race).
    With it, the new file replaces the old one atomically. Raises CliError.
    """
    directory = path.parent
    ensure_private_dir(directory)  # the config may hold tokens: owner only
    if not overwrite:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, CONFIG_FILE_MODE)
        except FileExistsError:
            raise CliError(f"{path} already exists; not overwriting it (use `init --force` "
                           f"to replace it with the defaults)") from None
        _write_all(fd, text)
        return
    write_private_atomically(path, text.encode("utf-8"), CONFIG_FILE_MODE)


def _write_all(fd: int, text: str) -> None:
    try:
        os.fchmod(fd, CONFIG_FILE_MODE)  # the umask may have removed bits; never added any
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        os.close(fd)


