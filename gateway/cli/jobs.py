"""`jobs list|show|result|tail|wait|cancel`: the operator's view of the job table.

Every command only reads the store, except `cancel`, which sets the row's cancel request
(the owning gateway's cancel poller does the rest). Ids may be typed as any unique prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import anyio

from gateway import proc
from gateway.cli.arguments import CommandTree, non_negative_int, positive_float, positive_int
from gateway.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    command,
    job_exit_code,
    no_job,
    on_job,
    run,
    store_settings,
    with_store,
)
from gateway.cli.format import (
    STATUS_COLOURS,
    ago,
    first_line,
    iso,
    paint,
    size,
    table,
    terminal_columns,
    terminal_safe,
    use_colour,
    visible,
    visible_data,
)
from gateway.cli.version import PROG
from gateway.config import Settings
from gateway.jobs.job_views import prompt_of, ran_for, request_of
from gateway.model import InstanceRow, JobRow, JobStatus
from gateway.store.base import JobStore
from neutral.durations import duration

# `jobs result` copies the answer in pieces this big: a 50 MB answer (the output cap) never
# sits whole in memory, and each piece is one store read.
RESULT_CHUNK_BYTES = 1 << 20
WAIT_POLL_S = 0.5  # `jobs wait` re-reads the row this often: a person notices no delay
DEFAULT_LIST_LIMIT = 20  # a screenful of jobs


def add_parsers(tree: CommandTree) -> None:
    """`jobs list|show|result|tail|wait|cancel`."""
    listing = tree.add_job_action("list", help="newest jobs first")
    listing.add_argument("--status", action="append", choices=[s.value for s in JobStatus],
                         help="only this status (repeat for several)")
    listing.add_argument("--provider", help="only this provider")
    listing.add_argument("--limit", type=positive_int, default=DEFAULT_LIST_LIMIT,
                         help=f"at most this many (default {DEFAULT_LIST_LIMIT})")
    listing.add_argument("--json", action="store_true", help="a JSON array, one object per job")
    listing.set_defaults(handler=cmd_jobs_list)
    show = tree.add_job_action("show", help="one job in detail")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print it as a JSON object")
    show.set_defaults(handler=cmd_jobs_show)
    result = tree.add_job_action(
        "result", help="a finished job's answer",
        description="Print the job's whole answer (its parsed text; --raw: the CLI's "
                    "stdout), ending with a newline. With --max-bytes it prints one page "
                    "from --offset; pages are exact byte ranges: concatenated they are the "
                    "whole output, and the next page's command is on stderr.")
    result.add_argument("id")
    result.add_argument("--offset", type=non_negative_int, default=0,
                        help="first byte to print (default 0)")
    result.add_argument("--max-bytes", type=positive_int, default=None,
                        help="print one page of at most this many bytes (default: the rest "
                             "of the answer)")
    result.add_argument("--raw", action="store_true",
                        help="the CLI's raw stdout instead of the parsed answer")
    result.set_defaults(handler=cmd_jobs_result)
    tail = tree.add_job_action(
        "tail", help="a job's output so far; -f: follow it to the end",
        description="Print the job's output so far (the parsed text; --raw: the CLI's "
                    "stdout) and, with -f, new output as it arrives until the job ends. The "
                    "exit status says how the job ended.")
    tail.add_argument("id")
    tail.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    tail.add_argument("--raw", action="store_true", help="the CLI's raw stdout stream")
    tail.set_defaults(handler=cmd_jobs_tail)
    wait = tree.add_job_action(
        "wait", help="wait until a job ends",
        description="Wait for the job to end; print its final status. The exit status says "
                    "how it ended (8: still active when --timeout passed).")
    wait.add_argument("id")
    wait.add_argument("--timeout", type=positive_float, metavar="S",
                      help="give up after S seconds (default: wait as long as it takes)")
    wait.set_defaults(handler=cmd_jobs_wait)
    cancel = tree.add_job_action("cancel", help="request a cancel")
    cancel.add_argument("id")
    cancel.set_defaults(handler=cmd_jobs_cancel)


# -- what a row says ------------------------------------------------------------------------


def _reported_session(job: JobRow) -> str | None:
    """The native session the CLI reported (result_json), which the caller resumes with;
    `session_id` is only the one the caller asked to resume, NULL for a fresh one."""
    result = _result_without_text(job)
    session = result.get("session_id") if isinstance(result, dict) else None
    return session if isinstance(session, str) and session else None


def _result_without_text(job: JobRow) -> Any:
    try:
        data = json.loads(job.result_json) if job.result_json else None
    except ValueError:
        return job.result_json
    if isinstance(data, dict):
        data.pop("text", None)
    return data


def job_summary(job: JobRow, now: float) -> dict[str, Any]:
    """The stable keys of `jobs list --json` (one object per job)."""
    return {
        "id": job.id, "provider": job.provider, "status": job.status.value,
        "transport": job.transport, "model": job.model, "prompt": first_line(prompt_of(job)),
        "created_at": iso(job.created_at), "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at), "ran_s": _round(ran_for(job, now)),
        "owner_instance": job.owner_instance, "hostname": job.hostname,
        "exit_code": job.exit_code, "error_kind": job.error_kind, "error": job.error,
        "output_bytes": job.output_bytes, "cancel_requested": job.cancel_requested_at is not None,
        "runs_on": json.loads(job.runs_on) if job.runs_on else "here",
        "unschedulable_reason": job.unschedulable_reason,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# -- list -----------------------------------------------------------------------------------


def cmd_jobs_list(args: argparse.Namespace) -> int:
    settings = store_settings(args)
    statuses = [JobStatus(s) for s in args.status] if args.status else None

    async def fetch(store: JobStore) -> tuple[list[JobRow], float]:
        # The job machinery: only a command that reads jobs loads it.
        from gateway.jobs.on_read import finalize_on_read  # deferred: start-up

        assert settings is not None
        jobs = await store.list_jobs(statuses=statuses, provider=args.provider,
                                     limit=args.limit, with_output=False)
        jobs = [await finalize_on_read(settings, store, job) for job in jobs]
        if statuses is not None:  # one that was finalized may no longer match
            jobs = [job for job in jobs if job.status in statuses]
        return jobs, await store.now()

    jobs, now = run(with_store, settings, fetch) if settings else ([], time.time())
    if args.json:
        print(json.dumps([job_summary(job, now) for job in jobs], indent=2))
        return EXIT_OK
    if settings is None:
        print("No jobs yet (the job store has not been created).")
        return EXIT_OK
    if not jobs:
        print("No matching jobs.")
        return EXIT_OK
    colour = use_colour()
    header = ("ID", "PROVIDER", "STATUS", "CREATED", "RAN", "PROMPT")
    rows, colours = [], []
    waiting: list[str] = []  # jobs for other hosts that no live worker meets now
    for job in jobs:
        status = job.status.value + (" !" if job.error_kind and job.status.is_terminal else "")
        if job.status is JobStatus.QUEUED and job.unschedulable_reason:
            status += " *"
            waiting.append(f"* {job.id[:8]}: {job.unschedulable_reason}")
        rows.append((job.id[:8], job.provider, status, ago(job.created_at, now),
                     duration(ran_for(job, now)), visible(first_line(prompt_of(job)))))
        colours.append(("", "", STATUS_COLOURS[job.status] if colour else "", "", "", ""))
    for line in table(header, rows, width=terminal_columns(), colours=colours):
        print(line)
    for line in waiting:
        print(visible(line))
    return EXIT_OK


# -- show -----------------------------------------------------------------------------------


async def _details(_settings: Settings, store: JobStore, job: JobRow) -> dict[str, Any]:
    # The job machinery and the worktrees: only `jobs show` loads them.
    from gateway.jobs.on_read import instance_lease_held  # deferred: start-up
    from gateway.jobs.worktrees.finish import worktree_of  # deferred: start-up

    now = await store.now()
    owner: InstanceRow | None = next((i for i in await store.list_instances()
                                      if i.instance_id == job.owner_instance), None)
    answer = await store.read_output(job.id, 0, 0, answer=True)
    on_this_host = job.hostname == proc.hostname() and job.boot_id in (None, proc.boot_id())
    alive: bool | None = None
    if job.pid is not None and job.pid_started_at is not None and on_this_host:
        alive = proc.is_process_alive(job.pid, job.pid_started_at)
    queued_for = None
    if job.created_at is not None:
        start = job.started_at.timestamp() if job.started_at else (
            job.finished_at.timestamp() if job.finished_at else now)
        queued_for = max(0.0, start - job.created_at.timestamp())
    return {
        **job_summary(job, now),
        "updated_at": iso(job.updated_at), "queued_s": _round(queued_for),
        "lease_deadline": iso(job.lease_deadline),
        "cancel_requested_at": iso(job.cancel_requested_at),
        "correlation_id": job.correlation_id, "working_dir": job.working_dir,
        "session_id": job.session_id, "reported_session_id": _reported_session(job),
        "forced": job.forced, "truncated": job.truncated,
        "answer_bytes": answer[1] if answer else 0,
        "run": {"hostname": job.hostname, "this_host": on_this_host, "pid": job.pid,
                "pgid": job.pgid, "pid_started_at": iso(_utc(job.pid_started_at)),
                "alive": alive},
        "owner": None if owner is None else {
            "instance_id": owner.instance_id, "hostname": owner.hostname, "pid": owner.pid,
            "role": owner.role, "version": owner.version,
            "last_heartbeat": iso(owner.heartbeat_at),
            "lease_held": instance_lease_held(owner, now),
            "stopped_at": iso(owner.stopped_at)},
        "worktree": worktree_of(job.request_json, job.result_json),
        "request": request_of(job),
        "result": _result_without_text(job),
        "stderr_tail": job.stderr_tail,
        "_now": now,
    }


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def cmd_jobs_show(args: argparse.Namespace) -> int:
    info = on_job(args, _details)
    now = info.pop("_now")
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return EXIT_OK
    info = visible_data(info)  # job data is shown, never obeyed, by the terminal
    colour = use_colour()
    status = JobStatus(info["status"])

    def line(name: str, value: Any) -> None:
        print(f"{name:<12} {'-' if value in (None, '') else value}")

    def when(key: str) -> str | None:
        value = info[key]
        if value is None:
            return None
        return f"{value}  ({ago(datetime.fromisoformat(value), now)})"

    line("id", info["id"])
    line("provider", f"{info['provider']} ({info['transport']})")
    reason = f"  {info['error_kind']}: {info['error']}" if info["error_kind"] else ""
    line("status", paint(status.value, STATUS_COLOURS[status], colour) + reason)
    line("model", info["model"])
    line("prompt", first_line(info["prompt"]))
    line("created", when("created_at"))
    line("started", when("started_at"))
    line("finished", when("finished_at"))
    line("queued for", duration(info["queued_s"]) if info["queued_s"] is not None else None)
    line("ran for", duration(info["ran_s"]) if info["ran_s"] is not None else None)
    run_at = info["run"]
    alive = {True: "alive", False: "not running", None: (
        "unknown (another host)" if not run_at["this_host"] else "no process")}[run_at["alive"]]
    line("runs on", f"{run_at['hostname'] or '-'} pid {run_at['pid'] or '-'} ({alive})")
    owner = info["owner"]
    if owner is None:
        line("owner", f"{info['owner_instance']} (no instance row: gone)")
    else:
        lease = "lease held" if owner["lease_held"] else "lease lapsed"
        stopped = ", stopped" if owner["stopped_at"] else ""
        line("owner", f"{owner['instance_id']} ({owner['role']} pid {owner['pid']} on "
                      f"{owner['hostname']}, {lease}{stopped})")
    line("exit code", info["exit_code"])
    line("output", f"{size(info['output_bytes'])}" + (" (truncated)" if info["truncated"] else ""))
    line("answer", f"{size(info['answer_bytes'])} (print it with `{command()} jobs result "
                   f"{info['id'][:8]}`)")
    line("cancel", info["cancel_requested_at"] and f"requested {info['cancel_requested_at']}")
    asked, reported = info["session_id"], info["reported_session_id"]
    if asked and reported and asked != reported:
        line("session", f"{reported} (resumed from {asked})")
    else:
        line("session", reported or asked)
    line("working dir", info["working_dir"])
    tree = info["worktree"]
    if tree is not None:  # an isolated job (#27): what became of its worktree
        line("worktree", f"{tree['state']}: branch {tree['branch']}"
                         + (f" at {tree['path']}" if tree["path"] else ""))
    line("request", json.dumps(info["request"], sort_keys=True, ensure_ascii=False))
    if info["result"]:
        line("result", json.dumps(info["result"], sort_keys=True, ensure_ascii=False))
    if info["stderr_tail"]:
        print("stderr (last lines):")
        print(info["stderr_tail"].rstrip("\n"))
    return EXIT_OK


# -- result, tail, wait ---------------------------------------------------------------------


def cmd_jobs_result(args: argparse.Namespace) -> int:
    """The whole answer by default (`> file` gets all of it, as `docker logs` does), read
    from the store in bounded chunks so memory stays flat; --max-bytes asks for one page."""
    paged = args.max_bytes is not None
    # Control characters shown visibly on a terminal; a pipe gets the exact bytes.
    out = terminal_safe(sys.stdout.buffer)

    async def copy(_settings: Settings, store: JobStore,
                   job: JobRow) -> tuple[JobRow, int, int, bytes]:
        """Write the answer from `args.offset`: (job, end offset, total, last byte)."""
        if job.status.is_active:
            return job, args.offset, 0, b""
        offset, total, last = args.offset, 0, b""
        while True:
            want = args.max_bytes if paged else RESULT_CHUNK_BYTES
            found = await store.read_output(job.id, offset, want, answer=not args.raw)
            data, total = found if found is not None else (b"", 0)
            # Raw bytes, not text: pages split mid-character still concatenate exactly.
            out.write(data)
            offset += len(data)
            last = data[-1:] or last
            if paged or not data or offset >= total:
                return job, offset, total, last

    job, end, total, last = on_job(args, copy)
    if job.status.is_active:
        print(f"{PROG}: job {job.id} is still {job.status.value}; follow it with "
              f"`{command()} jobs tail -f {job.id[:8]}` or wait with `{command()} jobs wait "
              f"{job.id[:8]}`", file=sys.stderr)
        return job_exit_code(job)
    if not paged and args.offset == 0 and last and last != b"\n":
        out.write(b"\n")  # a whole answer ends its line; pages stay exact
    out.flush()
    if paged and end < total:
        print(f"{PROG}: bytes {args.offset}-{end} of {total}; next page: "
              f"{command()} jobs result {job.id[:8]} --offset {end} --max-bytes {args.max_bytes}",
              file=sys.stderr)
    if job.status is not JobStatus.COMPLETED:
        _say_outcome(job)
    return job_exit_code(job)


def _say_outcome(job: JobRow) -> None:
    reason = f"{job.error_kind}: {job.error}" if job.error_kind else (job.error or "no detail")
    print(f"{PROG}: job {job.id} {job.status.value} ({visible(reason)})", file=sys.stderr)


def cmd_jobs_tail(args: argparse.Namespace) -> int:
    from gateway.cli.tail import follow_job  # deferred: start-up (spools and parsers: only `jobs tail`)

    async def tail(settings: Settings, store: JobStore, job: JobRow) -> JobRow:
        return await follow_job(settings, store, job.id, follow=args.follow, raw=args.raw,
                                out=terminal_safe(sys.stdout.buffer))

    job = on_job(args, tail)
    if job.status.is_terminal and job.status is not JobStatus.COMPLETED:
        _say_outcome(job)
    return job_exit_code(job)


async def wait_for(store: JobStore, job_id: str, timeout_s: float | None,
                   progress: bool, settings: Settings | None = None) -> JobRow:
    """Re-read the row until it is terminal or timeout_s passed; a status line on stderr
    (rewritten in place on a terminal) while it waits. With `settings`, a run that ends
    meanwhile with its owner gone is finalized on read (gateway/jobs/finalizer.py)."""
    # The job machinery: only a command that waits loads it.
    from gateway.jobs.on_read import finalize_on_read  # deferred: start-up

    started = time.monotonic()
    live = progress and sys.stderr.isatty()
    row = await store.get_job(job_id, with_output=False)
    assert row is not None
    with anyio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
        while row.status.is_active:
            if live:
                print(f"\r{PROG}: job {job_id[:8]} {row.status.value}, "
                      f"{size(row.output_bytes)} so far, "
                      f"{duration(time.monotonic() - started)}\033[K", end="",
                      file=sys.stderr, flush=True)
            await anyio.sleep(WAIT_POLL_S)
            fresh = await store.get_job(job_id, with_output=False)
            if fresh is None:
                break
            row = fresh if settings is None else await finalize_on_read(settings, store, fresh)
    if live:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    return row


def cmd_jobs_wait(args: argparse.Namespace) -> int:
    async def wait(settings: Settings, store: JobStore, job: JobRow) -> JobRow:
        return await wait_for(store, job.id, args.timeout, progress=True, settings=settings)

    job = on_job(args, wait)
    print(job.status.value)
    if job.status.is_active:
        print(f"{PROG}: job {job.id} still {job.status.value} after {args.timeout:g} s",
              file=sys.stderr)
    elif job.status is not JobStatus.COMPLETED:
        _say_outcome(job)
    return job_exit_code(job)


# -- cancel ---------------------------------------------------------------------------------


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    async def cancel(_settings: Settings, store: JobStore,
                     found: JobRow) -> tuple[Settings, JobRow | None, bool]:
        # The job machinery: only `jobs cancel` loads it.
        from gateway.jobs.on_read import instance_lease_held  # deferred: start-up

        job = await store.request_cancel(found.id)
        if job is None or job.status.is_terminal:
            return _settings, job, False
        now = await store.now()
        owner = next((i for i in await store.list_instances()
                      if i.instance_id == job.owner_instance), None)
        return _settings, job, owner is not None and owner.stopped_at is None and (
            instance_lease_held(owner, now))

    settings, job, owner_live = on_job(args, cancel)
    if job is None:
        no_job(args.id)
    if job.status.is_terminal:
        print(f"Job {job.id} already finished as {job.status.value}; nothing to cancel.")
        return EXIT_FAILURE
    print(f"Cancel requested for job {job.id} ({job.status.value}, owned by gateway instance "
          f"{job.owner_instance}).")
    if owner_live:
        print(f"That gateway's cancel poller stops it within about "
              f"{settings.lease.cancel_poll_s:g} s; check with: {command()} jobs show {job.id[:8]}")
    else:
        print("Its gateway instance does not look alive: if it is gone, the job is marked "
              "orphaned once its lease expires ([lease] ttl_s).")
    return EXIT_OK

