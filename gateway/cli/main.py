"""The operator's command line: `serve` (the default), `init`, `doctor`, `jobs ...`.

Exit codes: 0 success, 1 failure (a command that could not do its job), 2 usage or
configuration error. A bad config prints one line per problem and never a traceback; an
unexpected error prints one line (a traceback only with --debug or `logging.level = "debug"`).

`serve` prints nothing at all to stdout: there, stdout is the MCP stdio channel. The other
commands talk to a human on stdout and put errors on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio

from gateway import __version__
from gateway.config import ConfigError, Settings, default_config_path, load_settings
from gateway.fs import ensure_private_dir
from gateway.logs import configure_logging, redact_text
from gateway.model import JobRow, JobStatus
from gateway.store.base import StoreUnavailable, answer_in, page_of
from providers.loopback import is_loopback_host

PROG = "agent-cli-gateway"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the shell's convention for Ctrl-C

DEFAULT_LIST_LIMIT = 20  # a screenful of jobs
DEFAULT_RESULT_BYTES = 65_536  # one page of `jobs result`, like llm_job_result's default page
CONFIG_FILE_MODE = 0o600
TOKEN_HOWTO = (
    "set [http] auth_token in the config file or the AGENT_GATEWAY_HTTP__AUTH_TOKEN environment "
    "variable (for example: export AGENT_GATEWAY_HTTP__AUTH_TOKEN=\"$(openssl rand -hex 32)\")"
)

T = TypeVar("T")


class CliError(Exception):
    """A failure reported as one line on stderr, with the exit code to return."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


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


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("must be between 0 and 65535")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. `--config` and `--debug` work before or after the command."""
    # On subcommands these default to SUPPRESS so they never overwrite a value given before
    # the subcommand name (`agent-cli-gateway --config X doctor`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                        help="config file (default: $AGENT_GATEWAY_CONFIG or "
                             "~/.agent-cli-gateway/config.toml)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging and full tracebacks")

    parser = argparse.ArgumentParser(
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

    doctor = commands.add_parser("doctor", parents=[common],
                                 help="check the config, the store and the provider CLIs")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=cmd_doctor)

    jobs = commands.add_parser("jobs", parents=[common], help="inspect and cancel jobs")
    jobs_commands = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    listing = jobs_commands.add_parser("list", parents=[common], help="newest jobs first")
    listing.add_argument("--status", action="append", choices=[s.value for s in JobStatus],
                         help="only this status (repeat for several)")
    listing.add_argument("--provider", help="only this provider")
    listing.add_argument("--limit", type=_positive_int, default=DEFAULT_LIST_LIMIT,
                         help=f"at most this many (default {DEFAULT_LIST_LIMIT})")
    listing.set_defaults(handler=cmd_jobs_list)
    show = jobs_commands.add_parser("show", parents=[common], help="one job's row")
    show.add_argument("id")
    show.set_defaults(handler=cmd_jobs_show)
    result = jobs_commands.add_parser(
        "result", parents=[common], help="a job's output, one page at a time",
        description="Print a page of the job's answer (its parsed text; --raw: the CLI's "
                    "stdout). Pages are byte ranges: concatenated they are the whole output.")
    result.add_argument("id")
    result.add_argument("--offset", type=_non_negative_int, default=0,
                        help="first byte to print (default 0)")
    result.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_RESULT_BYTES,
                        help=f"page size in bytes (default {DEFAULT_RESULT_BYTES})")
    result.add_argument("--raw", action="store_true",
                        help="the CLI's raw stdout instead of the parsed answer")
    result.set_defaults(handler=cmd_jobs_result)
    cancel = jobs_commands.add_parser("cancel", parents=[common], help="request a cancel")
    cancel.add_argument("id")
    cancel.set_defaults(handler=cmd_jobs_cancel)
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
        return handler(args)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except CliError as exc:
        _error(str(exc))
        return exc.code
    except StoreUnavailable as exc:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        _error(f"the job store is unavailable: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        _error(f"error: {type(exc).__name__}: {exc}")
        return EXIT_FAILURE


def _error(message: str) -> None:
    # Error text may quote a DSN or a header; the redactor is the last line of defence.
    print(f"{PROG}: {redact_text(message)}", file=sys.stderr)


def _load(args: argparse.Namespace, *, quiet: bool) -> Settings:
    """Load the config and set up logging (quiet: warnings and up, for human commands)."""
    settings = load_settings(args.config)
    args.debug = args.debug or settings.logging.level == "debug"
    level = "debug" if args.debug else settings.logging.level
    if quiet and level in ("debug", "info") and not args.debug:
        level = "warning"
    configure_logging(level, settings.logging.format)
    return settings


def _run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return anyio.run(fn, *args)


# -- serve ---------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve MCP. Everything this prints goes to stderr: stdout is the protocol channel."""
    try:
        settings = _load(args, quiet=False)
    except ConfigError as exc:
        if args.transport != "stdio":
            raise  # an operator started it by hand and reads this message
        # An MCP client that sees the server exit before the handshake shows only
        # "connection closed": serve anyway, and let every tool say what is wrong.
        _error(str(exc))
        from gateway.mcp.serve import serve_broken_setup

        return serve_broken_setup(exc)
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

    return serve(settings, transport=args.transport, host=host, port=port,
                 no_auth=args.no_auth)


# -- init ----------------------------------------------------------------------------------


def example_config_text() -> str:
    """The commented starting config shipped inside the package (== config.example.toml)."""
    return resources.files("gateway").joinpath("config.example.toml").read_text("utf-8")


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


# -- doctor --------------------------------------------------------------------------------

_MARKS = {"ok": "ok", "warning": "WARN", "error": "FAIL", "disabled": "off", "skipped": "skip"}


def cmd_doctor(args: argparse.Namespace) -> int:
    from gateway.cli.doctor import run_doctor, summarize

    configure_logging("debug" if args.debug else "warning", "auto")
    report = run_doctor(args.config)
    config_broken = any(c.name == "config" and c.status == "error" for c in report.checks)
    # Same codes as every other command: 2 for a bad config, 1 for anything else broken.
    code = EXIT_USAGE if config_broken else EXIT_OK if report.ok else EXIT_FAILURE
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return code
    print(f"{PROG} {report.version}")
    width = max(len(check.name) for check in report.checks)
    for check in report.checks:
        print(f"  {_MARKS[check.status]:<4}  {check.name:<{width}}  {check.summary}")
        for problem in check.details.get("problems", []):
            print(f"        {'':<{width}}  - {problem}")
    errors, warnings = summarize(report.checks)
    if errors:
        print(f"{errors} problem(s) to fix, {warnings} warning(s).")
    else:
        print(f"Ready ({warnings} warning(s)).")
    return code


# -- jobs ----------------------------------------------------------------------------------


def _store_settings(args: argparse.Namespace) -> Settings | None:
    """Settings for a jobs command; None when the SQLite file does not exist yet."""
    settings = _load(args, quiet=True)
    if settings.persistence.backend == "memory":
        raise CliError("persistence.backend is 'memory': jobs live only inside the gateway "
                       "process that runs them; the jobs commands need sqlite or postgres")
    if settings.persistence.backend == "sqlite" and not settings.persistence.path.exists():
        return None
    return settings


async def _with_store(settings: Settings, action: Callable[[Any], Awaitable[T]]) -> T:
    from gateway.store import open_store

    store = await open_store(settings)
    try:
        return await action(store)
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()


def _no_job(job_id: str) -> NoReturn:
    raise CliError(f"no job {job_id!r} (list recent ones with `{PROG} jobs list`)")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _duration(job: JobRow) -> str:
    if job.started_at is None:
        return "-"
    end = job.finished_at or job.updated_at
    if end is None:
        return "-"
    seconds = max(0.0, (end - job.started_at).total_seconds())
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def cmd_jobs_list(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    if settings is None:
        print("No jobs yet (the job store has not been created).")
        return EXIT_OK
    statuses = [JobStatus(s) for s in args.status] if args.status else None

    async def fetch(store: Any) -> list[JobRow]:
        return list(await store.list_jobs(statuses=statuses, provider=args.provider,
                                          limit=args.limit))

    jobs = _run(_with_store, settings, fetch)
    if not jobs:
        print("No matching jobs.")
        return EXIT_OK
    header = ("ID", "PROVIDER", "STATUS", "CREATED (UTC)", "RAN", "ERROR")
    rows = [(j.id, j.provider, j.status.value, _when(j.created_at), _duration(j),
             j.error_kind or "") for j in jobs]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def cmd_jobs_show(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    if settings is None:
        _no_job(args.id)
    job = _run(_with_store, settings, lambda store: store.get_job(args.id))
    if job is None:
        _no_job(args.id)
    for name in JobRow.column_names():
        if name in ("output", "stderr_tail"):
            continue
        value = getattr(job, name)
        if name == "result_json" and value:
            value = _without_text(value)
        shown = _when(value) if isinstance(value, datetime) else value
        print(f"{name:<20} {'-' if shown is None else shown}")
    print(f"{'output':<20} {job.output_bytes} bytes (page it with `{PROG} jobs result {job.id}`)")
    if job.stderr_tail:
        print("stderr (last lines):")
        print(job.stderr_tail.rstrip("\n"))
    return EXIT_OK


def _without_text(result_json: str) -> str:
    """result_json minus the answer itself (that is what `jobs result` is for)."""
    try:
        data = json.loads(result_json)
    except ValueError:
        return result_json
    if isinstance(data, dict):
        data.pop("text", None)
    return json.dumps(data, sort_keys=True)


def answer_bytes(job: JobRow, raw: bool) -> bytes:
    """What `jobs result` pages: the parsed answer, or the CLI's stdout when raw (or no parse)."""
    output = (job.output or "").encode()
    where = None if raw else answer_in(job.result_json)
    if isinstance(where, str):
        return where.encode()
    return page_of(output, 0, len(output), where)[0]


def cmd_jobs_result(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    if settings is None:
        _no_job(args.id)
    job = _run(_with_store, settings, lambda store: store.get_job(args.id))
    if job is None:
        _no_job(args.id)
    data = answer_bytes(job, args.raw)
    end = min(len(data), args.offset + args.max_bytes)
    page = data[args.offset:end]
    # Raw bytes, not text: pages split mid-character still concatenate to the exact output.
    sys.stdout.buffer.write(page)
    sys.stdout.flush()
    if job.status.is_active:
        print(f"{PROG}: job {job.id} is still {job.status.value}; this is its output so far",
              file=sys.stderr)
    if end < len(data):
        print(f"{PROG}: bytes {args.offset}-{end} of {len(data)}; next page: "
              f"{PROG} jobs result {job.id} --offset {end}", file=sys.stderr)
    if job.status in (JobStatus.COMPLETED, JobStatus.QUEUED, JobStatus.RUNNING):
        return EXIT_OK
    reason = f"{job.error_kind}: {job.error}" if job.error_kind else (job.error or "no detail")
    print(f"{PROG}: job {job.id} {job.status.value} ({reason})", file=sys.stderr)
    return EXIT_FAILURE


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    settings = _store_settings(args)
    if settings is None:
        _no_job(args.id)

    async def cancel(store: Any) -> tuple[JobRow | None, bool]:
        job = await store.request_cancel(args.id)
        if job is None or job.status.is_terminal:
            return job, False
        return job, await _owner_is_live(store, job.owner_instance)

    job, owner_live = _run(_with_store, settings, cancel)
    if job is None:
        _no_job(args.id)
    if job.status.is_terminal:
        print(f"Job {job.id} already finished as {job.status.value}; nothing to cancel.")
        return EXIT_FAILURE
    print(f"Cancel requested for job {job.id} ({job.status.value}, owned by gateway instance "
          f"{job.owner_instance}).")
    if owner_live:
        print(f"That gateway's cancel poller stops it within about "
              f"{settings.lease.cancel_poll_s:g} s; check with: {PROG} jobs show {job.id}")
    else:
        print("Its gateway instance does not look alive: if it is gone, the job is marked "
              "orphaned once its lease expires ([lease] ttl_s).")
    return EXIT_OK


async def _owner_is_live(store: Any, instance_id: str | None) -> bool:
    """Whether the owning instance is registered, not stopped and within its lease."""
    if instance_id is None:
        return False
    now = await store.now()
    for instance in await store.list_instances():
        if instance.instance_id != instance_id:
            continue
        expires = instance.lease_expires_at
        return instance.stopped_at is None and expires is not None and expires.timestamp() > now
    return False
