"""`jobs diff|apply|discard ID` and `worktrees [list|gc]`: an isolated job's changes and the
worktrees of this host, from the shell (the same code as `llm_job_changes`).

The parsers are added by `add_parsers` (main.py calls every command module's); the work is
imported only when a command runs, so `serve` never pays for it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import anyio

from gateway import proc
from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_OK, CliError, load, on_job, run, store_settings, with_store
from gateway.config import Settings
from gateway.model import GatewayError, JobRow
from gateway.store.base import JobStore

DIFF_PAGE_BYTES = 1_000_000


def add_parsers(tree: CommandTree) -> None:
    """`jobs diff|apply|discard ID` and `worktrees [list|gc]`."""
    diff = tree.add_job_action("diff", help="an isolated job's changes against its base")
    diff.add_argument("id")
    diff.add_argument("--stat", action="store_true", help="a diffstat instead of the patch")
    diff.set_defaults(handler=cmd_jobs_diff)
    apply = tree.add_job_action(
        "apply", help="bring an isolated job's changes into its checkout",
        description="Apply the job's changes to its working_dir's checkout as uncommitted "
                    "edits, or change nothing when they touch files with changes there or "
                    "do not apply; then remove its worktree and branch.")
    apply.add_argument("id")
    apply.set_defaults(handler=cmd_jobs_apply)
    discard = tree.add_job_action("discard",
                                  help="remove an isolated job's worktree and branch")
    discard.add_argument("id")
    discard.set_defaults(handler=cmd_jobs_discard)
    worktrees = tree.add(
        "worktrees", help="the job worktrees of this host",
        description="list (the default): path, branch, job, state, size on disk, age. gc: "
                    "remove the directories past [worktrees] retention_h (branches stay).")
    worktrees.add_argument("worktrees_command", nargs="?", choices=["list", "gc"],
                           default="list")
    worktrees.add_argument("--json", action="store_true", help="print JSON")
    worktrees.set_defaults(handler=cmd_worktrees)


def _on_own_job(args: argparse.Namespace, action: Any, remote_action: Any) -> Any:
    """Run the local `action` on the job, or `remote_action` for a worktree job that ran on
    another host (its changes are the patch its worker stored)."""
    from gateway.jobs.worktrees import remote  # deferred: start-up (git worktrees: only these commands)

    async def act(_settings: Settings, store: JobStore, job: JobRow) -> Any:
        try:
            if remote.is_remote_worktree(job):
                return await remote_action(store, job, proc.hostname())
            return await anyio.to_thread.run_sync(action, job, proc.hostname())
        except GatewayError as err:
            raise CliError(err.message) from None

    return on_job(args, act)


def cmd_jobs_diff(args: argparse.Namespace) -> int:
    from gateway.jobs.worktrees import changes, remote  # deferred: start-up (only these commands)

    fmt = "stat" if args.stat else "patch"

    def whole(job: JobRow, host: str) -> str:
        parts, offset = [], 0
        while True:
            page = changes.diff(job, host, fmt, offset, DIFF_PAGE_BYTES)
            parts.append(page.text)
            if page.next_offset is None:
                return "".join(parts)
            offset = page.next_offset

    async def whole_remote(store: JobStore, job: JobRow, host: str) -> str:
        page = await remote.remote_diff(store, job, host, fmt, 0, 2**62)
        return page.text

    text = _on_own_job(args, whole, whole_remote)
    print(text, end="" if text.endswith("\n") or not text else "\n")
    return EXIT_OK


def cmd_jobs_apply(args: argparse.Namespace) -> int:
    from gateway.jobs.worktrees import changes, remote  # deferred: start-up (only these commands)

    done = _on_own_job(args, changes.apply, remote.remote_apply)
    gone = (f"branch {done['branch_removed']} and its worktree removed"
            if "branch_removed" in done else
            f"its worktree on {done['worktree_host']} is removed by the worker there")
    print(f"Applied {len(done['files'])} changed files to {done['checkout']} (uncommitted); "
          f"{gone}.")
    return EXIT_OK


def cmd_jobs_discard(args: argparse.Namespace) -> int:
    from gateway.jobs.worktrees import changes, remote  # deferred: start-up (only these commands)

    done = _on_own_job(args, changes.discard, remote.remote_discard)
    if done.get("worktree_host"):
        print(f"Discarded; its worktree on {done['worktree_host']} is removed by the worker "
              f"there.")
    else:
        print(f"Discarded branch {done['branch']} and its worktree.")
    return EXIT_OK


def _rows(args: argparse.Namespace, job_ids: list[str]) -> dict[str, JobRow | None] | None:
    """Each job's row in the store (None: there is no store to read)."""
    settings = store_settings(args)
    if settings is None:
        return None

    async def read(store: JobStore) -> dict[str, JobRow | None]:
        return {job_id: await store.get_job(job_id, with_output=False) for job_id in job_ids}

    async def session() -> dict[str, JobRow | None]:
        return await with_store(settings, read)

    return run(session)


def cmd_worktrees(args: argparse.Namespace) -> int:
    # The worktrees: only these commands load them.
    from gateway.jobs.worktrees.gc import list_worktrees  # deferred: start-up

    settings = load(args, quiet=True)
    host = proc.hostname()
    if args.worktrees_command == "gc":
        removed = _expire(args, settings, host)
        if args.json:
            print(json.dumps({"removed": removed}))
        else:
            print(f"Removed {len(removed)} worktree directories past retention "
                  f"({settings.worktrees.retention_h:g} h); their branches stay.")
            for path in removed:
                print(f"  {path}")
        return EXIT_OK
    ids = [e.record.job_id for e in list_worktrees(settings, host, sizes=False)]
    found = _rows(args, ids)
    entries = list_worktrees(settings, host, now=time.time(), rows=found)
    statuses = {job_id: str(row.status) for job_id, row in (found or {}).items() if row}
    rows = [{**e.as_dict(), "job_status": statuses.get(e.record.job_id)} for e in entries]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("No job worktrees on this host.")
    for row in rows:
        size = "-" if row["size_bytes"] is None else f"{row['size_bytes'] / 1e6:.1f} MB"
        print(f"{row['path']}  {row['branch']}  job {row['job_id'][:8]} "
              f"({row['job_status'] or 'not in the store'})  {row['state']}  {size}  "
              f"{row['age_s'] / 3600:.1f} h")
    return EXIT_OK


def _expire(args: argparse.Namespace, settings: Settings, host: str) -> list[str]:
    """`worktrees gc`: what to remove comes from the store, so with no store nothing is."""
    # The worktrees: only these commands load them.
    from gateway.jobs.worktrees.gc import expire_worktrees  # deferred: start-up

    found = store_settings(args)
    if found is None:
        return []

    async def expire(store: JobStore) -> list[str]:
        return await expire_worktrees(settings, host, store)

    async def session() -> list[str]:
        return await with_store(found, expire)

    return run(session)
