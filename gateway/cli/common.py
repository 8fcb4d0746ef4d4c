"""What every command shares: exit codes, errors, settings, a store for one command, ids.

Exit codes (docs/operations.md lists them): 0 success, 1 failure (a command that could not
do its job), 2 usage or configuration error, 130 interrupted. Commands that report a job's
outcome (`jobs wait`, `jobs tail`, `jobs result`, `run`) map it through JOB_EXIT_CODES, so a
script can branch on how the job ended without parsing text.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio
import structlog

from gateway.cli.version import PROG
from gateway.config import Settings, load_settings, unknown_env_warnings
from gateway.fs import uncreatable
from gateway.logs import configure_logging
from gateway.model import JobRow, JobStatus
from neutral.redaction import redact_text

if TYPE_CHECKING:  # the store's modules load with the commands that read it, not for serve
    from gateway.store.base import JobStore

log = structlog.get_logger(__name__)



@functools.cache
def invocation() -> tuple[str, ...]:
    """The argv that runs this command line from a shell, as it runs now (#44). From a
    checkout, the recommended install before a release, `agent-cli-gateway` is no command on
    the user's PATH (only inside `uv run`): the hints then say `uv run --directory <checkout>
    agent-cli-gateway`; an installed one (uvx, pip) is the bare name."""
    package = Path(__file__).resolve().parents[1]
    root = package.parent
    if (root / "pyproject.toml").is_file() and "site-packages" not in package.parts:
        return ("uv", "run", "--directory", str(root), PROG)
    return (PROG,)


def command() -> str:
    """`invocation()` as a shell would take it: what every next-step hint starts with."""
    return shlex.join(invocation())
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the shell's convention for Ctrl-C

# How a job ended, as the exit status of the commands that follow one. 0-2 keep their
# meaning above; a job that has not ended when the command stops waiting is 8.
JOB_EXIT_CODES: dict[JobStatus, int] = {
    JobStatus.COMPLETED: EXIT_OK,
    JobStatus.FAILED: 3,
    JobStatus.TIMED_OUT: 4,
    JobStatus.CANCELLED: 5,
    JobStatus.ORPHANED: 6,
}
EXIT_STILL_ACTIVE = 8

AMBIGUOUS_SHOWN = 10  # candidates listed for an ambiguous id prefix

T = TypeVar("T")


class CliError(Exception):
    """A failure reported as one line on stderr, with the exit code to return."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def error(message: str) -> None:
    # Error text may quote a DSN or a header; the redactor is the last line of defence.
    print(f"{PROG}: {redact_text(message)}", file=sys.stderr)


def job_exit_code(job: JobRow) -> int:
    """The exit status that tells a script how `job` ended (or that it has not)."""
    return JOB_EXIT_CODES.get(job.status, EXIT_STILL_ACTIVE)


def load(args: argparse.Namespace, *, quiet: bool) -> Settings:
    """Load the config and set up logging (quiet: warnings and up, for human commands)."""
    settings = load_settings(args.config)
    args.debug = args.debug or settings.logging.level == "debug"
    level = "debug" if args.debug else settings.logging.level
    if quiet and level in ("debug", "info") and not args.debug:
        level = "warning"
    configure_logging(level, settings.logging.format)
    warn_unknown_env()
    return settings


def warn_unknown_env() -> None:
    """Warn (stderr) about AGENT_GATEWAY_* variables that set nothing, with the nearest
    real one: a one-underscore typo must not be ignored silently."""
    for warning in unknown_env_warnings(os.environ):
        log.warning(warning, action="config_unknown_env")


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return anyio.run(fn, *args)


def store_settings(args: argparse.Namespace) -> Settings | None:
    """Settings for a command that only reads the store; None when it holds no schema yet.

    The schema is inspected read-only first: a reading command never creates a store, nor
    migrates one that an older or newer gateway wrote (that is `serve`'s decision).
    """
    # Loads sqlite3 and the store's modules: only the commands that read the store pay.
    from gateway.store import POSTGRES_DRIVER_MISSING  # deferred: start-up
    from gateway.store.base import SCHEMA_VERSION  # deferred: start-up
    from gateway.store.inspect import inspect_schema  # deferred: start-up

    settings = load(args, quiet=True)
    if settings.persistence.backend == "memory":
        raise CliError("persistence.backend is 'memory': jobs live only inside the gateway "
                       "process that runs them; the jobs commands need sqlite or postgres")
    try:
        state = run(inspect_schema, settings)
    except ImportError as exc:  # the postgres extra is not installed: say what to install
        if exc.name != "asyncpg":
            raise
        raise CliError(POSTGRES_DRIVER_MISSING) from None
    if not state.exists:
        problem = uncreatable(settings.persistence.path)
        if problem is not None:
            raise CliError(f"the job store {settings.persistence.path} cannot be created "
                           f"({problem}); set [persistence] path to a writable location")
    if state.version is None:
        return None
    if state.version != SCHEMA_VERSION:
        raise CliError(f"the job store's schema is version {state.version}, this "
                       f"{PROG} reads version {SCHEMA_VERSION}: {state.what_serve_does()}")
    return settings


async def with_store(settings: Settings, action: Callable[[JobStore], Awaitable[T]]) -> T:
    """Open the store, run `action`, close it (also when cancelled)."""
    from gateway.store import open_store  # deferred: start-up (serve does not read it here)

    store = await open_store(settings)
    try:
        return await action(store)
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()


def no_job(job_id: str) -> NoReturn:
    raise CliError(f"no job {job_id!r} (list recent ones with `{command()} jobs list`)")


async def resolve_job_id(store: JobStore, text: str) -> str:
    """The one job id `text` names: the whole id or a unique prefix of it.

    CliError when nothing matches, or when several do (listing them, so the operator can
    type one more character).
    """
    text = text.strip()
    found = await store.find_job_ids(text, AMBIGUOUS_SHOWN + 1)
    if text in found:
        return text
    if not found:
        no_job(text)
    if len(found) == 1:
        return found[0]
    shown = found[:AMBIGUOUS_SHOWN]
    more = " and more" if len(found) > AMBIGUOUS_SHOWN else ""
    raise CliError(f"job id prefix {text!r} is ambiguous; it matches {', '.join(shown)}{more} "
                   f"(type more of the id)")


async def get_light_job(store: JobStore, text: str) -> JobRow:
    """The job `text` names (a whole id or a unique prefix), as a light row."""
    job = await store.get_job(await resolve_job_id(store, text), with_output=False)
    if job is None:  # purged between the two reads
        no_job(text)
    return job


def on_job(args: argparse.Namespace,
           action: Callable[[Settings, JobStore, JobRow], Awaitable[T]]) -> T:
    """Run `action` on the job `args.id` names (a whole id or a unique prefix; a light
    row), in one store session: the shape of every `jobs <action> ID` command."""
    settings = store_settings(args)
    if settings is None:
        no_job(args.id)

    async def act(store: JobStore) -> T:
        # The job machinery: only a command on one job loads it.
        from gateway.jobs.on_read import finalize_on_read  # deferred: start-up

        job = await finalize_on_read(settings, store, await get_light_job(store, args.id))
        return await action(settings, store, job)

    async def session() -> T:
        return await with_store(settings, act)

    return anyio.run(session)
