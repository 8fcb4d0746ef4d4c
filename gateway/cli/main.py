"""The operator's command line: argparse and dispatch, plus `serve` and `init`.

The commands live by concern: jobs.py (`jobs ...`), tail.py (`jobs tail`), run.py (`run`),
instances.py, doctor.py; common.py has the exit codes, format.py the tables and times.
Exit codes (common.py): 0 success, 1 failure, 2 usage or configuration error, 130
interrupted; the commands that follow a job report how it ended (JOB_EXIT_CODES). A bad
config prints one line per problem and never a traceback; an unexpected error prints one
line (a traceback only with --debug or `logging.level = "debug"`).

`serve` prints nothing at all to stdout: there, stdout is the MCP stdio channel. The other
commands talk to a human on stdout and put errors on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import NoReturn

from gateway import __version__, platform
from gateway.cli import config_show, worktrees
from gateway.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CliError,
    error,
    load,
)
from gateway.config import ConfigError, default_config_path, unknown_env_warnings
from gateway.fs import ensure_private_dir
from gateway.model import JobStatus
from gateway.platform import ENV_VAR as PLATFORM_ENV
from gateway.platform import UnknownPlatform
from gateway.store.base import StoreUnavailable
from providers.loopback import is_loopback_host

DEFAULT_LIST_LIMIT = 20  # a screenful of jobs
CONFIG_FILE_MODE = 0o600
# What `init` writes: the example config, at the repository's root and inside the wheel.
EXAMPLE_CONFIG = "config.example.toml"
TOKEN_HOWTO = (
    "set [http] auth_token in the config file or the AGENT_GATEWAY_HTTP__AUTH_TOKEN environment "
    "variable (for example: export AGENT_GATEWAY_HTTP__AUTH_TOKEN=\"$(openssl rand -hex 32)\")"
)
STDIO_HINT = (
    f"{PROG}: this is an MCP server speaking JSON-RPC on stdin/stdout; it waits for an MCP "
    f"client, not for typing. Add it to a client instead, e.g.\n"
    f"  claude mcp add agent-cli-gateway -- {PROG}\n"
    f"  codex mcp add agent-cli-gateway -- {PROG}\n"
    f"or in a client's JSON config: \"mcpServers\": {{\"agent-cli-gateway\": "
    f"{{\"command\": \"{PROG}\"}}}}. Check the setup with `{PROG} doctor`; try a provider "
    f"from the shell with `{PROG} run PROVIDER PROMPT`. Ctrl-D or Ctrl-C stops it."
)


# -- parser --------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A handler imported when its command runs: `--help` and `serve` load no more than
    they need (MCP clients time a server's start)."""

    def handler(args: argparse.Namespace) -> int:
        from importlib import import_module

        command: Callable[[argparse.Namespace], int] = getattr(import_module(module), name)
        return command(args)

    return handler


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("must be between 0 and 65535")
    return value


INVALID_CHOICE = re.compile(r"invalid choice: '(?P<typed>[^']*)' \(choose from (?P<choices>.*)\)")


COMMAND_PREFIXES = ("argument COMMAND: ", "argument ACTION: ")  # the metavars below
SUGGEST_CUTOFF = 0.5  # difflib ratio: 'lsit' -> 'list' (0.5), 'claud' -> 'claude'


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped command (`jobs lst`), as git and gh
    have; subparsers are built from the same class, so every level gets it."""

    def error(self, message: str) -> NoReturn:
        found = INVALID_CHOICE.search(message)
        if found:
            typed = found.group("typed")
            choices = re.findall(r"'([^']*)'", found.group("choices"))
            close = difflib.get_close_matches(typed, choices, n=1, cutoff=SUGGEST_CUTOFF)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            prefix = message[:found.start()]
            what = ("unknown command" if prefix in COMMAND_PREFIXES
                    else f"{prefix}invalid choice")
            message = f"{what} '{typed}'{hint}; choose from {', '.join(choices)}"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. `--config` and `--debug` work before or after the command."""
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
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--config", type=Path, default=None, metavar="PATH",
                        help="config file (default: $AGENT_GATEWAY_CONFIG or "
                             "~/.agent-cli-gateway/config.toml)")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="debug logging and full tracebacks")
    parser.set_defaults(handler=cmd_serve, transport="stdio", host=None, port=None,
                        no_auth=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser("serve", parents=[common], help="serve MCP (the default)",
                                description="Serve MCP. Logs go to stderr; stdout is the "
                                            "stdio channel.")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    serve.add_argument("--host", help="HTTP bind address (default: [http] host)")
    serve.add_argument("--port", type=_port, help="HTTP port (default: [http] port)")
    serve.add_argument("--no-auth", action="store_true",
                       help="HTTP without a bearer token; only allowed on a loopback host")
    serve.set_defaults(handler=cmd_serve)

    init = commands.add_parser("init", parents=[common], help="write a starting config file",
                               description="Write a commented starting config (mode 0600).")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(handler=cmd_init)

    doctor = commands.add_parser(
        "doctor", parents=[common], help="check the config, the store and the providers",
        description="Check the config, the store (read-only: never creates or migrates it), "
                    "each provider CLI (found under an MCP client's PATH? version? logged "
                    "in?) and each API provider. Exit 1 when not ready.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_lazy("gateway.cli.doctor", "cmd_doctor"))

    run = commands.add_parser(
        "run", parents=[common], help="run one request from the shell",
        description="Submit one request as a durable job (as an MCP client would), wait for "
                    "it with a progress line on stderr, print the answer on stdout. The exit "
                    "status says how the job ended.")
    run.add_argument("provider", metavar="PROVIDER", help="a CLI or API provider name")
    run.add_argument("prompt", metavar="PROMPT", help="the prompt")
    run.add_argument("--async", dest="async_", action="store_true",
                     help="print the job id and return; the job runs on in the background")
    run.add_argument("--model", help="the model (default: the provider's)")
    run.add_argument("--working-dir", metavar="DIR", help="the CLI's working directory")
    run.add_argument("--timeout", type=_positive_float, metavar="S",
                     help="the job's wall-clock timeout in seconds")
    run.add_argument("--force", action="store_true",
                     help="run again even if an identical job is running or just completed")
    run.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    run.set_defaults(handler=_lazy("gateway.cli.run", "cmd_run"))

    instances = commands.add_parser("instances", parents=[common],
                                    help="the gateway instances that share the store")
    instances.add_argument("--all", action="store_true",
                           help="also the stopped and lapsed instances that own no job")
    instances.add_argument("--json", action="store_true", help="print them as JSON")
    instances.set_defaults(handler=_lazy("gateway.cli.instances", "cmd_instances"))

    usage = commands.add_parser(
        "usage", parents=[common], help="tokens and cost of every job in the store",
        description="Usage totals of every job in the store (any gateway sharing it), "
                    "per provider, model or UTC day; --by day draws a bar per day.")
    usage.add_argument("--by", choices=("provider", "model", "day"), default="provider",
                       help="how to group (default: provider)")
    usage.add_argument("--since", metavar="DAY",
                       help="first UTC day: YYYY-MM-DD, 'today' or Nd (the last N days)")
    usage.add_argument("--until", metavar="DAY", help="last UTC day (default: today)")
    usage.add_argument("--json", action="store_true", help="print the totals as JSON")
    usage.set_defaults(handler=_lazy("gateway.cli.usage", "cmd_usage"))
    finalize = commands.add_parser(
        "finalize", parents=[common], help=argparse.SUPPRESS,
        description="Write the terminal row of a run that ended while its gateway was gone "
                    "(a supervisor starts this, its settings on stdin).")
    finalize.add_argument("spool_dir", metavar="SPOOL_DIR", help="the run's spool directory")
    finalize.set_defaults(handler=_lazy("gateway.cli.finalize", "cmd_finalize"))

    jobs = commands.add_parser("jobs", parents=[common], help="inspect, follow and cancel jobs",
                               description="A job id may be given as any unique prefix.")
    jobs_commands = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    listing = jobs_commands.add_parser("list", parents=[common], help="newest jobs first")
    listing.add_argument("--status", action="append", choices=[s.value for s in JobStatus],
                         help="only this status (repeat for several)")
    listing.add_argument("--provider", help="only this provider")
    listing.add_argument("--limit", type=_positive_int, default=DEFAULT_LIST_LIMIT,
                         help=f"at most this many (default {DEFAULT_LIST_LIMIT})")
    listing.add_argument("--json", action="store_true", help="a JSON array, one object per job")
    listing.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_list"))
    show = jobs_commands.add_parser("show", parents=[common], help="one job in detail")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print it as a JSON object")
    show.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_show"))
    result = jobs_commands.add_parser(
        "result", parents=[common], help="a finished job's answer",
        description="Print the job's whole answer (its parsed text; --raw: the CLI's "
                    "stdout), ending with a newline. With --max-bytes it prints one page "
                    "from --offset; pages are exact byte ranges: concatenated they are the "
                    "whole output, and the next page's command is on stderr.")
    result.add_argument("id")
    result.add_argument("--offset", type=_non_negative_int, default=0,
                        help="first byte to print (default 0)")
    result.add_argument("--max-bytes", type=_positive_int, default=None,
                        help="print one page of at most this many bytes (default: the rest "
                             "of the answer)")
    result.add_argument("--raw", action="store_true",
                        help="the CLI's raw stdout instead of the parsed answer")
    result.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_result"))
    tail = jobs_commands.add_parser(
        "tail", parents=[common], help="a job's output so far; -f: follow it to the end",
        description="Print the job's output so far (the parsed text; --raw: the CLI's "
                    "stdout) and, with -f, new output as it arrives until the job ends. The "
                    "exit status says how the job ended.")
    tail.add_argument("id")
    tail.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    tail.add_argument("--raw", action="store_true", help="the CLI's raw stdout stream")
    tail.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_tail"))
    wait = jobs_commands.add_parser(
        "wait", parents=[common], help="wait until a job ends",
        description="Wait for the job to end; print its final status. The exit status says "
                    "how it ended (8: still active when --timeout passed).")
    wait.add_argument("id")
    wait.add_argument("--timeout", type=_positive_float, metavar="S",
                      help="give up after S seconds (default: wait as long as it takes)")
    wait.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_wait"))
    cancel = jobs_commands.add_parser("cancel", parents=[common], help="request a cancel")
    cancel.add_argument("id")
    cancel.set_defaults(handler=_lazy("gateway.cli.jobs", "cmd_jobs_cancel"))
    worktrees.add_parsers(commands, jobs_commands, common)  # jobs diff|apply|discard, worktrees
    config_show.add_parsers(commands, common)  # config show
    return parser


# -- entry point ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (never raises, never a bare traceback)."""
    parser = build_parser()
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
    except StoreUnavailable as exc:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        error(f"the job store is unavailable: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        error(f"error: {type(exc).__name__}: {exc}")
        return EXIT_FAILURE


# -- serve ---------------------------------------------------------------------------------

# The secret settings a gateway reads from its environment once, at start (then they leave
# it: gateway.proc.keep_secrets_from_children). PGPASSWORD and API keys are read at each use.
SETTINGS_SECRET_ENV = ("AGENT_GATEWAY_HTTP__AUTH_TOKEN", "AGENT_GATEWAY_PERSISTENCE__DSN")


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve MCP. Everything this prints goes to stderr: stdout is the protocol channel."""
    from gateway import platform

    problem = platform.setup_problem()  # no POSIX process model, a bad AGENT_GATEWAY_PLATFORM
    if problem is not None:
        if args.transport != "stdio":
            raise CliError(problem, EXIT_FAILURE)
        error(problem)
        from gateway.mcp.serve import serve_setup_error

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
        from gateway.mcp.serve import serve_broken_setup

        return serve_broken_setup(exc)
    from gateway import proc

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
    from gateway.mcp.serve import serve  # lazy: the other commands start fast

    if args.transport == "stdio" and _isatty(sys.stdin):
        print(STDIO_HINT, file=sys.stderr)  # stderr: stdout is the protocol channel

    return serve(settings, transport=args.transport, host=host, port=port,
                 no_auth=args.no_auth)


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
    print(f"Every value in it is the default; edit it, then check it with: {PROG} doctor")
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
    temporary = directory / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, CONFIG_FILE_MODE)
    try:
        _write_all(fd, text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _write_all(fd: int, text: str) -> None:
    try:
        os.fchmod(fd, CONFIG_FILE_MODE)  # the umask may have removed bits; never added any
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        os.close(fd)


