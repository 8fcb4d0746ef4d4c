"""`attempts run PROMPT --target ...`: start an attempt group from the shell and follow it.

A gateway instance (role `cli`) is started as `run` starts one, the group is admitted through
the same code as the `llm_attempts` tool (jobs/attempts/admit.py), and the command follows it
with a progress line on stderr until it ends (its checks and its judge included: this
gateway's coordinator runs them), then prints the comparison table (comparison.py's) on
stdout. The exit status says whether a winner exists: 0 yes, 1 no. Like a foreground `run`,
stopping the command (Ctrl-C, SIGTERM) stops the attempts it drives.

`--check` is split the way a shell splits words (shlex) and never run through a shell: the
gateway runs that argv in each attempt's worktree.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from gateway.cli.arguments import positive_float
from gateway.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, CliError, load
from gateway.cli.run import refused
from gateway.cli.version import PROG
from gateway.config import Settings
from gateway.model import GatewayError
from gateway.store.attempts import CheckState, GroupStatus
from neutral.durations import duration

if TYPE_CHECKING:
    from gateway.jobs.attempts.admit import GroupRequest

POLL_S = 0.5  # how often the group is read while it runs (one store read each)


def add_parser(actions: Any, common: argparse.ArgumentParser) -> None:
    """`attempts run PROMPT --target P[:MODEL] ... [-n N] [--check CMD] [--until
    first-passing] [--judge P[:MODEL]] [--working-dir DIR]`."""
    run = actions.add_parser(
        "run", parents=[common], help="start a group and follow it to its comparison",
        description="Give PROMPT to several agents, each in its own worktree from the same "
                    "commit; run the check in each; print the comparison. Exit 0 when a "
                    "winner exists, 1 when none.")
    run.add_argument("prompt", metavar="PROMPT")
    run.add_argument("--target", action="append", required=True, metavar="PROVIDER[:MODEL]",
                     help="an agent to run (repeat it: --target claude --target codex:gpt-5)")
    run.add_argument("-n", type=int, default=1, metavar="N", dest="count",
                     help="attempts per target (default 1)")
    run.add_argument("--check", metavar="CMD",
                     help="the check, split like a shell splits words (never run by one)")
    run.add_argument("--check-timeout", type=positive_float, metavar="S",
                     help="the check's timeout in seconds (default 600)")
    run.add_argument("--until", choices=("all", "first-passing"), default="all",
                     help="first-passing: the first attempt whose check passes ends the group")
    run.add_argument("--judge", metavar="PROVIDER[:MODEL]",
                     help="one more agent that reads the qualifying attempts and names one")
    run.add_argument("--working-dir", metavar="DIR", help="the checkout (default: here)")
    run.add_argument("--timeout", type=positive_float, metavar="S",
                     help="each attempt's wall-clock timeout in seconds")
    run.set_defaults(handler=cmd_run)


def _provider_model(spec: str, what: str) -> tuple[str, str | None]:
    provider, _, model = spec.partition(":")
    if not provider or provider.startswith("-"):
        raise CliError(f"{what} must be PROVIDER or PROVIDER:MODEL; got {spec!r}", EXIT_USAGE)
    return provider, model or None


def group_request(args: argparse.Namespace) -> GroupRequest:
    """The group the command line asks for (usage errors exit 2)."""
    # The job machinery: only `attempts run` needs it, not the parser every command builds.
    from gateway.jobs.attempts.admit import AttemptTarget, GroupRequest  # deferred: start-up

    if args.count < 1:
        raise CliError("-n must be at least 1", EXIT_USAGE)
    targets = [AttemptTarget(*_provider_model(spec, "--target"), count=args.count)
               for spec in args.target]
    check = None
    if args.check is not None:
        try:
            check = shlex.split(args.check)
        except ValueError as exc:
            raise CliError(f"--check cannot be split into words: {exc}", EXIT_USAGE) from None
        if not check:
            raise CliError("--check is empty", EXIT_USAGE)
    judge = None
    if args.judge is not None:
        provider, model = _provider_model(args.judge, "--judge")
        judge = {"provider": provider, "model": model}
    request = GroupRequest(
        prompt=args.prompt, targets=targets,
        working_dir=os.path.abspath(args.working_dir or os.getcwd()), check=check,
        until=args.until.replace("-", "_"), judge=judge, timeout_s=args.timeout)
    if args.check_timeout is not None:
        request.check_timeout_s = args.check_timeout
    return request


def cmd_run(args: argparse.Namespace) -> int:
    settings = load(args, quiet=True)
    return asyncio.run(_drive(settings, group_request(args), debug=args.debug))


async def _drive(settings: Settings, request: GroupRequest, *, debug: bool) -> int:
    from gateway.cli.run import start_gateway  # deferred: start-up
    from gateway.jobs.attempts.admit import submit_group  # deferred: start-up
    from gateway.jobs.attempts.comparison import (  # deferred: start-up
        comparison,
        comparison_table,
    )
    from gateway.runtime import Gateway  # deferred: start-up

    # As a foreground `run`: stopping the command stops what it drives.
    lease = settings.lease.model_copy(update={"on_shutdown": "stop"})
    gateway = Gateway(settings.model_copy(update={"lease": lease}), role="cli")
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await start_gateway(gateway, tell=sys.stderr.isatty(), debug=debug)
        manager = await gateway.manager()
        try:
            submission = await submit_group(manager, request)
        except GatewayError as exc:
            raise refused(exc.kind.value, exc.message) from None
        group_id = submission.group.group_id
        joined = " (an identical group was running: joined it)" if submission.joined else ""
        print(f"{PROG}: group {group_id}: {len(submission.job_ids)} attempts{joined}",
              file=sys.stderr)
        await _follow(manager.store, group_id)
        group = await manager.store.get_attempt_group(group_id)
        assert group is not None
        data = await comparison(manager.store, manager.hostname, group)
        print(comparison_table(data))
        return EXIT_OK if data["winner"] else EXIT_FAILURE
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await asyncio.shield(gateway.stop())


async def _follow(store: Any, group_id: str) -> None:
    """Wait for the group to end, a progress line on stderr (rewritten on a terminal)."""
    started = time.monotonic()
    live = sys.stderr.isatty()
    last = ""
    while True:
        group = await store.get_attempt_group(group_id)
        if group is None or group.status is not GroupStatus.RUNNING:
            break
        line = await _progress(store, group_id, group.judge_job_id, time.monotonic() - started)
        if live:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        elif line != last:
            print(line, file=sys.stderr, flush=True)
        last = line
        await asyncio.sleep(POLL_S)
    if live:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    print(f"{PROG}: group {group_id} ended after {duration(time.monotonic() - started)}",
          file=sys.stderr)


async def _progress(store: Any, group_id: str, judge_job_id: str | None,
                    elapsed: float) -> str:
    attempts = await store.list_attempts(group_id)
    ended = checked = 0
    for attempt in attempts:
        job = await store.get_job(attempt.job_id, with_output=False)
        ended += bool(job is not None and not job.status.is_active)
        checked += attempt.check_state in (CheckState.DONE, CheckState.SKIPPED)
    judge = ", judging" if judge_job_id else ""
    # The elapsed time only on a terminal line: a log gets a line per change, not per tick.
    shown = f", {duration(elapsed)}" if sys.stderr.isatty() else ""
    return (f"{PROG}: {ended}/{len(attempts)} attempts ended, {checked} checked"
            f"{judge}{shown}")
