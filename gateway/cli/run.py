"""`run PROVIDER PROMPT`: one request from the shell, through the same job path as MCP.

A gateway instance (role `cli`) is started the way `serve` starts one (gateway/runtime.py),
the request is submitted through its JobManager (admission, dedup, limits, the durable row)
and the command waits for the job, a progress line on stderr, then prints the answer on
stdout. Whatever ends the wait (the job, Ctrl-C, SIGTERM) the gateway then stops cleanly:
it drains (a job still running is stopped and written `failed`/`shutdown`, never left
running for the reaper to orphan: a foreground `run` shuts down as `on_shutdown = "stop"`)
and marks its instance stopped.

`--async` prints the job id and returns at once; the job is driven by a detached copy of
this command (its own session, stdin/stdout/stderr closed) that exits when the job ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from gateway.cli.arguments import CommandTree, positive_float
from gateway.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    command,
    job_exit_code,
    load,
)
from gateway.cli.format import size, terminal_safe, visible
from gateway.cli.version import PROG
from gateway.config import Settings
from gateway.jobs.requests import SubmitRequest
from gateway.logs import configure_logging
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus
from gateway.store.base import JobStore
from neutral.durations import duration

if TYPE_CHECKING:  # `run` loads the job machinery only once it drives a job (_drive)
    from gateway.jobs.reads import JobReads
    from gateway.runtime import Gateway

START_TIMEOUT_S = 30.0  # store open + registration; a store that does not open is an error
STORE_RETRY_NOTE_S = 2.0  # one line per store-open retry on a terminal (runtime retries every 2 s)
DETACH_HANDSHAKE_S = 60.0  # how long `--async` waits for its detached copy to admit the job
PROGRESS_EVERY_S = 1.0  # the progress line's refresh rate
ANSWER_PAGE_BYTES = 256 * 1024  # the answer is copied from the store to stdout in pages
DETACHED_FLAG = "--detached-child"  # internal: this process is the copy `--async` started


def refused(kind: str, message: str) -> CliError:
    """A request the gateway refused, worded alike with and without --async (`not_found:
    The 'grok' command ...`); a request the user must change exits 2, like a usage error."""
    code = EXIT_USAGE if kind == ErrorKind.INVALID_INPUT.value else EXIT_FAILURE
    return CliError(f"{kind}: {message}", code)


def _request(args: argparse.Namespace) -> dict[str, Any]:
    # A relative --working-dir is this shell's: the gateway (and a detached copy) need it whole.
    working_dir = os.path.abspath(args.working_dir) if args.working_dir else None
    return {"provider": args.provider, "prompt": args.prompt, "model": args.model,
            "working_dir": working_dir, "timeout_s": args.timeout,
            "force_refresh": args.force}


def add_parsers(tree: CommandTree) -> None:
    """`run PROVIDER PROMPT`."""
    run = tree.add(
        "run", help="run one request from the shell",
        description="Submit one request as a durable job (as an MCP client would), wait for "
                    "it with a progress line on stderr, print the answer on stdout. The exit "
                    "status says how the job ended.")
    run.add_argument("provider", metavar="PROVIDER", help="a CLI or API provider name")
    run.add_argument("prompt", metavar="PROMPT", help="the prompt")
    run.add_argument("--async", dest="async_", action="store_true",
                     help="print the job id and return; the job runs on in the background")
    run.add_argument("--model", help="the model (default: the provider's)")
    run.add_argument("--working-dir", metavar="DIR", help="the CLI's working directory")
    run.add_argument("--timeout", type=positive_float, metavar="S",
                     help="the job's wall-clock timeout in seconds")
    run.add_argument("--force", action="store_true",
                     help="run again even if an identical job is running or just completed")
    run.add_argument("--detached-child", action="store_true", help=argparse.SUPPRESS)
    run.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    settings = load(args, quiet=True)
    if settings.persistence.backend == "memory" and args.async_:
        raise CliError("`run --async` needs a store other processes can read "
                       "(persistence.backend sqlite or postgres), not 'memory'")
    if args.detached_child:
        request = json.loads(sys.stdin.buffer.read() or b"{}")
        return asyncio.run(_drive(settings, request, detached=True, debug=args.debug))
    if args.async_:
        return _start_detached(_request(args))
    return asyncio.run(_drive(settings, _request(args), detached=False, debug=args.debug))


def _start_detached(request: dict[str, Any]) -> int:
    """Start the detached copy, hand it the request on stdin, print the id it admitted."""
    argv = [sys.executable, "-m", "gateway", *_passthrough(), "run", DETACHED_FLAG,
            request["provider"], "-"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps(request).encode())
    child.stdin.close()
    try:
        line = _read_line(child, DETACH_HANDSHAKE_S)
    finally:
        child.stdout.close()
    try:
        answer = json.loads(line) if line else {}
    except ValueError:
        answer = {}
    if "job_id" not in answer:
        if "error" in answer:
            raise refused(str(answer.get("error_kind") or "error"), str(answer["error"]))
        code = child.poll()
        reason = f"it exited with status {code}" if code is not None else "no answer in time"
        raise CliError(f"the job was not started: {reason}")
    print(answer["job_id"])
    print(f"{PROG}: job {answer['job_id']} {answer['status']}; follow it with `{command()} jobs "
          f"tail -f {answer['job_id'][:8]}`", file=sys.stderr)
    return EXIT_OK


def _passthrough() -> list[str]:
    """The global options of this invocation the detached copy needs (its config)."""
    argv, keep = sys.argv[1:], []
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            keep += [arg, argv[index + 1]]
        elif arg.startswith("--config="):
            keep.append(arg)
    return keep


def _read_line(child: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return b""
    return child.stdout.readline()


async def _drive(settings: Settings, request: dict[str, Any], *, detached: bool,
                 debug: bool = False) -> int:
    from gateway.runtime import Gateway  # deferred: start-up (the job machinery: only `run`)

    if not detached:
        # A person who stops a foreground `run` (Ctrl-C, SIGTERM) wants the job stopped, not
        # left to a supervisor; the detached copy of `run --async` keeps the configured
        # on_shutdown, so its job survives that copy and is adopted like any other.
        lease = settings.lease.model_copy(update={"on_shutdown": "stop"})
        settings = settings.model_copy(update={"lease": lease})
    gateway = Gateway(settings, role="cli")
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await start_gateway(gateway, tell=not detached and sys.stderr.isatty(), debug=debug)
        manager = await gateway.manager()
        submit = SubmitRequest(prompt=request.get("prompt"), model=request.get("model"),
                               working_dir=request.get("working_dir"),
                               timeout_s=request.get("timeout_s"),
                               force_refresh=bool(request.get("force_refresh")))
        try:
            submission = await manager.submit(request["provider"], submit)
        except GatewayError as exc:
            if detached:
                _answer_parent({"error": exc.message, "error_kind": exc.kind.value})
                return EXIT_FAILURE
            raise refused(exc.kind.value, exc.message) from None
        job = submission.job
        if detached:
            _answer_parent({"job_id": job.id, "status": job.status.value})
        else:
            joined = " (an identical job was running: joined it)" if submission.deduplicated else ""
            print(f"{PROG}: job {job.id} {job.status.value}{joined}", file=sys.stderr)
        final = await _wait(manager.reads, job.id, progress=not detached)
        if detached:
            return job_exit_code(final)
        await _print_answer(manager.store, final)
        return job_exit_code(final)
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await asyncio.shield(gateway.stop())


async def start_gateway(gateway: Gateway, *, tell: bool, debug: bool) -> None:
    """Start the gateway, waiting up to START_TIMEOUT_S for a store that is down. While it
    retries, a person at a terminal gets one plain line per retry (`tell`) instead of a
    JSON log record each; a script gets only the final error. A cause that no retry fixes
    (credentials refused, a path that can never exist) is the final error at once."""
    settings = gateway.settings
    if not debug:  # the retries are told below, and the final error by the caller
        configure_logging("error", settings.logging.format, stream=io.StringIO())
    task = asyncio.create_task(gateway.start(), name="cli_gateway_start")
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not task.done():
            left = deadline - time.monotonic()
            if left <= 0:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise CliError(f"the job store did not open within {START_TIMEOUT_S:g} s: "
                               f"{gateway.start_error or 'no reason given'}")
            await asyncio.wait({task}, timeout=min(STORE_RETRY_NOTE_S, left))
            if tell and not task.done() and gateway.start_error:
                print(f"{PROG}: the job store is not reachable ({gateway.start_error}); "
                      f"retrying, {duration(max(0.0, deadline - time.monotonic()))} left",
                      file=sys.stderr, flush=True)
        task.result()
    finally:
        if not debug:  # as `load(quiet=True)` set it up
            configure_logging("error" if settings.logging.level == "error" else "warning",
                              settings.logging.format)
    if gateway.failed:
        raise CliError(f"setup_error: the job store cannot be opened: {gateway.start_error}")


def _answer_parent(message: dict[str, Any]) -> None:
    """Tell `run --async` what happened, then let go of stdout (the parent has exited)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


async def _wait(reads: JobReads, job_id: str, *, progress: bool) -> JobRow:
    started = time.monotonic()
    live = progress and sys.stderr.isatty()

    async def on_progress(output_bytes: int, elapsed: float) -> None:
        if live:
            print(f"\r{PROG}: running, {size(output_bytes)} of output, {duration(elapsed)}"
                  f"\033[K", end="", file=sys.stderr, flush=True)

    row = await reads.wait(job_id, float("inf"), on_progress=on_progress)
    if live:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    if progress:
        print(f"{PROG}: job {job_id} {row.status.value} after "
              f"{duration(time.monotonic() - started)}", file=sys.stderr)
    return row


async def _print_answer(store: JobStore, job: JobRow) -> None:
    """The answer (or, for a job that did not complete, what it printed) on stdout."""
    out = terminal_safe(sys.stdout.buffer)
    offset, last = 0, b"\n"
    while True:
        found = await store.read_output(job.id, offset, ANSWER_PAGE_BYTES,
                                        answer=True)
        if found is None or not found[0]:
            break
        page, total = found
        out.write(page)
        offset, last = offset + len(page), page[-1:]
        if offset >= total:
            break
    if last != b"\n":
        out.write(b"\n")
    out.flush()
    if job.status is not JobStatus.COMPLETED:
        reason = f"{job.error_kind}: {job.error}" if job.error_kind else job.error
        print(f"{PROG}: job {job.id} {job.status.value} ({visible(reason or '')})",
              file=sys.stderr)
