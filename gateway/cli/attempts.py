"""`attempts list|show|pick`: attempt groups from the shell (issue 39; docs/attempts.md).

The same code as the MCP tools: `show` prints llm_attempts_status's comparison, `pick`
runs llm_attempts_pick's (whose apply and discard are llm_job_changes'); `run` starts a
group and follows it (attempts_run.py).
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from gateway import proc
from gateway.cli import attempts_run
from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_OK, CliError, load, run, store_settings, with_store
from gateway.config import Settings
from gateway.model import GatewayError
from gateway.store.base import JobStore


def add_parsers(tree: CommandTree) -> None:
    """`attempts list`, `attempts show GROUP [--json]`, `attempts pick GROUP [JOB] [--keep]
    [--discard]`."""
    attempts = tree.add("attempts", help="attempt groups (best-of-N): list, show, pick",
                        description="Groups of attempts at one task (best-of-N).")
    actions = attempts.add_subparsers(dest="attempts_command", metavar="ACTION", required=True)
    attempts_run.add_parser(actions, tree.common)
    listed = actions.add_parser("list", parents=[tree.common], help="recent groups")
    listed.add_argument("--json", action="store_true", help="print JSON")
    listed.set_defaults(handler=cmd_list)
    show = actions.add_parser("show", parents=[tree.common], help="a group's comparison")
    show.add_argument("group")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=cmd_show)
    pick = actions.add_parser(
        "pick", parents=[tree.common], help="apply or keep one attempt, or discard all",
        description="Apply JOB's changes to the checkout (or --keep its branch) and discard "
                    "the other attempts; --discard (no JOB) discards every attempt.")
    pick.add_argument("group")
    pick.add_argument("job", nargs="?")
    how = pick.add_mutually_exclusive_group()
    how.add_argument("--keep", action="store_true", help="keep JOB's branch, do not apply")
    how.add_argument("--discard", action="store_true", help="discard every attempt")
    pick.set_defaults(handler=cmd_pick)


def _settings(args: argparse.Namespace) -> Settings:
    settings = store_settings(args)
    if settings is None:
        raise CliError("no job store yet: no attempt group was ever started")
    return settings


def cmd_list(args: argparse.Namespace) -> int:
    async def read(store: JobStore) -> list[dict[str, Any]]:
        return [{"group_id": g.group_id, "status": str(g.status), "base_sha": g.base_sha,
                 "prompt": g.prompt[:60], "winner": g.winner_job_id}
                for g in await store.list_attempt_groups(limit=50)]

    rows = run(with_store, _settings(args), read)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['group_id']}  {row['status']:<9} {row['base_sha'][:12]}  "
                  f"{row['prompt']}")
        if not rows:
            print("No attempt groups.")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from gateway.jobs.attempts.comparison import (  # deferred: start-up
        comparison,
        comparison_table,
    )

    async def read(store: JobStore) -> dict[str, Any]:
        group = await store.get_attempt_group(args.group)
        if group is None:
            raise CliError(f"no attempt group {args.group!r}")
        return await comparison(store, proc.hostname(), group)

    data = run(with_store, _settings(args), read)
    print(json.dumps(data, indent=2) if args.json else comparison_table(data))
    return EXIT_OK


def cmd_pick(args: argparse.Namespace) -> int:
    from gateway.jobs.attempts.pick import pick  # deferred: start-up
    from gateway.jobs.manager import JobManager  # deferred: start-up

    action = "discard" if args.discard else "keep" if args.keep else "apply"
    if action != "discard" and args.job is None:
        raise CliError(f"{action} needs JOB: the attempt to keep (see `attempts show`)", 2)
    settings = load(args, quiet=True)

    async def act(store: JobStore) -> dict[str, Any]:
        group = await store.get_attempt_group(args.group)
        if group is None:
            raise CliError(f"no attempt group {args.group!r}")
        # A manager of this command alone: its cancel is the store's request to the
        # gateways that run the attempts (it drives none itself).
        manager = JobManager(settings, store, f"cli-{uuid.uuid4()}", proc.hostname(),
                             proc.boot_id())
        try:
            return await pick(manager, group, args.job, action)
        except GatewayError as err:
            raise CliError(err.message) from None

    done = run(with_store, settings, act)
    print(f"group {args.group}: {done['status']} ({len(done['discarded'])} attempts "
          f"discarded)")
    return EXIT_OK
