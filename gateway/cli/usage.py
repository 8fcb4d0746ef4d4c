"""`usage`: tokens and cost of every job in the store, per provider, model or UTC day, with a
bar per day for `--by day` (issue 28; the numbers are llm_usage's, jobs/usage_report.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_OK, CliError, run, store_settings, with_store
from gateway.jobs.usage_report import usage_report, usage_table
from gateway.model import GatewayError
from gateway.store.base import JobStore


def add_parsers(tree: CommandTree) -> None:
    """`usage [--by provider|model|day] [--since DAY] [--until DAY] [--json]`."""
    usage = tree.add(
        "usage", help="tokens and cost of every job in the store",
        description="Usage totals of every job in the store (any gateway sharing it), "
                    "per provider, model or UTC day; --by day draws a bar per day.")
    usage.add_argument("--by", choices=("provider", "model", "day"), default="provider",
                       help="how to group (default: provider)")
    usage.add_argument("--since", metavar="DAY",
                       help="first UTC day: YYYY-MM-DD, 'today' or Nd (the last N days)")
    usage.add_argument("--until", metavar="DAY", help="last UTC day (default: today)")
    usage.add_argument("--json", action="store_true", help="print the totals as JSON")
    usage.set_defaults(handler=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    settings = store_settings(args)

    async def report(store: JobStore) -> dict[str, Any]:
        return await usage_report(store, args.by, args.since, args.until)

    try:
        data = run(with_store, settings, report) if settings else None
    except GatewayError as exc:  # a --since/--until that is not a day
        raise CliError(exc.message) from None
    if data is None:
        data = {"group_by": args.by, "since": args.since, "until": args.until, "groups": [],
                "totals": {"jobs": 0}, "no_usage_jobs": 0, "no_usage": []}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(usage_table(data))
    return EXIT_OK
