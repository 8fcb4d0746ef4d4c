"""`notices`: the completion notices in the store and how their delivery went (issue 40);
`notices test`: one test notice through every configured sink, with what happened for each.

A notice is listed as `delivered`, `skipped` (filtered out by `[notify] on` or
`min_duration_s`, or no sink was on), `failed` (after `max_attempts`: its last error says
why) or `pending` (due again at NEXT, or claimed by a deliverer now).
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from gateway.cli.arguments import CommandTree, positive_int
from gateway.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CliError,
    load,
    run,
    store_settings,
    with_store,
)
from gateway.cli.format import iso, table, terminal_columns
from gateway.store.base import JobStore
from gateway.store.outbox import NOTICE_LIST_LIMIT, Notice

MAX_LIST = 10_000


def add_parsers(tree: CommandTree) -> None:
    """`notices [--failed] [--json] [--limit N]` and `notices test`."""
    notices = tree.add("notices", help="completion notices and their delivery")
    notices.add_argument("action", nargs="?", choices=["list", "test"], default="list",
                         help="list (the default) or test: send a test notice through "
                              "every configured sink")
    notices.add_argument("--failed", action="store_true",
                         help="only the notices that ended failed")
    notices.add_argument("--json", action="store_true", help="print them as JSON")
    notices.add_argument("--limit", type=positive_int, default=NOTICE_LIST_LIMIT,
                         help=f"at most this many, newest first (default {NOTICE_LIST_LIMIT})")
    notices.set_defaults(handler=cmd_notices)


def state_of(notice: Notice) -> str:
    if notice.failed_at is not None:
        return "failed"
    if notice.delivered_at is not None:
        return notice.outcome or "delivered"
    return "pending"


def as_json(notice: Notice) -> dict[str, Any]:
    return {**notice.payload(), "state": state_of(notice), "attempts": notice.attempts,
            "sinks_done": notice.sinks_done, "delivered_at": iso(notice.delivered_at),
            "failed_at": iso(notice.failed_at), "next_attempt_at": iso(notice.next_attempt_at),
            "last_error": notice.last_error}


def cmd_notices(args: argparse.Namespace) -> int:
    if args.action == "test":
        return cmd_notices_test(args)
    settings = store_settings(args)
    limit = min(args.limit, MAX_LIST)

    async def listed(store: JobStore) -> list[Notice]:
        return await store.list_notices(failed_only=args.failed, limit=limit)

    found = run(with_store, settings, listed) if settings else []
    if args.json:
        print(json.dumps([as_json(n) for n in found], indent=2))
        return EXIT_OK
    if not found:
        print("No failed notices." if args.failed else "No completion notices yet.")
        return EXIT_OK
    rows = [(n.job_id, n.provider, n.status, state_of(n), str(n.attempts),
             ",".join(n.sinks_done) or "-", iso(n.created_at) or "",
             (n.last_error or "")[:80]) for n in found]
    header = ("JOB", "PROVIDER", "STATUS", "DELIVERY", "TRIES", "SINKS DONE", "ENDED", "LAST ERROR")
    for line in table(header, rows, width=terminal_columns()):
        print(line)
    return EXIT_OK


def cmd_notices_test(args: argparse.Namespace) -> int:
    """Send one test notice through every configured sink now (not through the store), and
    say for each whether it went."""
    # The sinks (httpx2, subprocesses): only this command loads them.
    from gateway.childenv import secret_env_names  # deferred: start-up
    from gateway.jobs.notify.sinks import SinkError, send  # deferred: start-up

    settings = load(args, quiet=True)
    config = settings.notify
    if not config.sinks:
        raise CliError("no sink is configured: set [notify] desktop, command or webhook_url "
                       "(docs/configuration.md)", code=2)
    job_id = str(uuid.uuid4())
    notice = Notice(id=f"{job_id}:completed", job_id=job_id, provider="test",
                    status="completed", duration_s=42.0, created_at=datetime.now(UTC))
    payload = {**notice.payload(), "test": True,
               "summary": "agent-cli-gateway test notice: your sink works"}
    failures = 0
    for sink in config.sinks:
        try:
            run(send, sink, config, payload, secret_env_names(settings))
        except SinkError as exc:
            failures += 1
            print(f"{sink}: FAILED: {exc}")
        else:
            print(f"{sink}: sent")
    return EXIT_FAILURE if failures else EXIT_OK
