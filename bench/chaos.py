"""Chaos run: no job is ever lost, and no job is ever falsely declared lost.

Real gateway processes (`python -m gateway serve --transport http --no-auth`, one per slot)
share one store (SQLite file or PostgreSQL database) with short lease knobs. A driver
submits jobs to random instances through real MCP client sessions over Streamable HTTP
(`--sessions-per-instance` long-lived sessions per instance, 1 by default, and some calls
from brand-new clients, `--fresh-clients`; the fake provider CLIs
sleep a random, bounded time; every job has a unique prompt, so the fake CLI's spawn log
says how often each request ran), cancels some through an instance that does not own them,
optionally lets some clients give up on their first try within milliseconds
(`--impatient`), and meanwhile SIGKILLs, SIGSTOPs/SIGCONTs and SIGTERMs random instances
(a killed or terminated slot is restarted as a new process on a new port; at least one
instance is always unimpaired), and SIGKILLs the zygote of a live one (the process that
forks each of its runs' supervisors: the gateway lives on) and, with `--on-shutdown stop`
on PostgreSQL, stops the database server
once for a few seconds. Two scenarios (`--on-shutdown`): `detach`, the default, where runs
outlive SIGTERM and SIGKILL and a peer adopts or re-queues them, so every job that was not
cancelled must end `completed` with its answer (unfinished=0); and `stop`, where a
SIGTERM drains (running jobs end failed / shutdown: unfinished is only reported). Then it
lets everything settle, stops every
instance, and audits the rows (read straight from the store), the gateways' logs, the
spawn log and the process table. It prints

    chaos: backend=postgres jobs=N completed=… cancelled=… orphaned=… lost=0 false_orphans=0
           late_orphans=0 duplicate_runs=0 leftover_processes=0 unfinished=… flapped=0

(one line in the output; folded here)

and a second `chaos-info:` line with what happened (submits, lost answers, kills, outages…).

How to run (from the repository root; PostgreSQL needs initdb/pg_ctl, see tests/conftest.py):

    uv run python bench/chaos.py --backend sqlite --jobs 1200 --instances 5 --duration 300
    uv run python bench/chaos.py --backend postgres --jobs 1200 --instances 5 --duration 300

tests/chaos/test_chaos.py runs a short version of the same engine on both backends.

## The rules, and why each bound is what it is

Times are wall-clock seconds on this host: the driver stamps its own actions with
time.time(), SQLite rows use the local clock, PostgreSQL rows use the server's now() - the
same host clock. An instance is *impaired* while it cannot heartbeat: from SIGSTOP to
SIGCONT, from SIGKILL/SIGTERM on (forever), and for every instance during a store stall (the
PostgreSQL outage, from the stop call until the server accepts connections again plus
STORE_RECOVERY_S; on SQLite, a SIGSTOPped instance that was caught holding the write lock,
which blocks every writer until SIGCONT - the driver probes for it right after each SIGSTOP).
An unimpaired instance commits a heartbeat at least once every P = heartbeat_s + TICK_JITTER_S.

* unfinished (detach scenario only): a job that is terminal but neither completed nor
  cancelled (orphaned, failed, timed out). With one instance always alive, the owner of a
  job is either alive (it finishes the job, or self-heals it) or proven gone (a peer on
  this host adopts the run or re-queues unstarted work), so none may remain.
* flapped: a job whose terminal status later changed. The driver reads every job as a
  poller would (every OBSERVE_S, for the whole run) and keeps the first terminal status
  it saw; a job whose later reads or final row differ, or that a reaper logged as
  orphaned and that did not end orphaned, flapped (a client that saw `orphaned` stopped
  polling and reported the work lost). Every instance runs on one host, where `orphaned`
  is final: none may flap.
* lost: a job row still queued/running when the settle time is over (before the final
  shutdown, whose drain would otherwise paper over it), or a job id an instance answered
  that has no row at all.
* false orphan: a job orphaned (final row `orphaned`: T = its finished_at; or a reaper's "job
  orphaned" log line for a job that later self-healed: T = the line's time, a few ms after
  the UPDATE) at time T although its lease was provably valid at T:
  the lease is valid until the latest of created_at + ttl, started_at + ttl, and, for every
  stretch [a, b] (a >= created_at, b <= T) during which its owner was unimpaired for at least
  P, b - P + ttl (that stretch contains a heartbeat that renewed the job). An orphan before
  that moment (minus CLOCK_EPSILON_S) is false. So an owner that was never impaired can never
  lose a job, and one SIGSTOPped at S may lose its jobs only from S - P + ttl on.
* late orphan: the owner died for good (SIGKILL, SIGTERM whose drain did not finish the job,
  or SIGSTOP followed by SIGKILL) at D (when its process was seen gone), and a job it owned
  and had not finished before D was neither orphaned nor finished by
      first_reaper(max(D + ttl, exit of the job's process group)) + SWEEP_BOUND_S,
  stretched by the time any instance spent SIGSTOPped inside that window. Why: its lease
  lapses at most ttl after its last heartbeat (<= D); a reaper on this host leaves a provably
  alive process group alone until it exits (the driver watches every spawned fake CLI and
  notes when it ends - exits or turns zombie, the reaper's own notion - every WATCH_S);
  first_reaper(t) is the first moment >= t at which some instance has been unimpaired for
  P (so it is admitting and sweeping) and stays so for SWEEP_BOUND_S; a reaper sweeps every
  sweep_interval_s, may skip one sweep after a late
  heartbeat (hence two intervals plus jitter); and a SIGSTOPped instance can hold a lock a
  sweep needs (the SQLite write lock, or PostgreSQL row locks on its own jobs), so no sweep
  completes while it is stopped. The owner is the row's final one: a job that was adopted
  or re-queued belongs to a live instance by then and is held to `lost` (still active
  after settling) and, in the detach scenario, `unfinished`. Settling waits on progress,
  not on an estimate of the clock: while some active row changes (starts, ends) the
  backlog is draining, however slowly a loaded box starts processes; once no active row
  has changed for ttl + sweeps + the longest job + margins (or SETTLE_CAP_S passed), what
  is still active is lost. A job it lets finish late is judged like any other, and one
  that never ends is still lost.
* duplicate run: for one prompt, more fake CLI spawns than rows of that prompt that were ever
  marked running (the queued -> running CAS is the one permit to spawn; a retried submit of
  the same prompt may legitimately create a second job once the first failed or was
  orphaned, and that job may run once more).
* leftover process: a fake CLI process (pid and start time from the spawn log) still alive
  after every gateway was stopped and the longest job had time to end. Gateways that do not
  exit on SIGTERM are reported too (`stuck_gateways`).

"Submitted but the answer was lost" (timeout, connection refused, SIGSTOPped instance): the
driver retries the same prompt on another instance (dedup returns the existing job if the
first attempt did create one and it is still active). In the audit, jobs are matched by
prompt: every row is a job and is checked like any other; a prompt with no row at all was
never admitted (no instance answered with a job id for it: if one had, the missing row
would count as lost), so it is counted as `unconfirmed_without_row`, not as lost.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `python bench/chaos.py` puts only bench/ on the path
    sys.path.insert(0, str(REPO_ROOT))

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
import httpx2  # noqa: E402
import psutil  # noqa: E402
import tomli_w  # noqa: E402
from mcp import Client  # noqa: E402

from bench.chaos_worktrees import TamperScene  # noqa: E402
from gateway.config import Settings, load_settings  # noqa: E402
from gateway.jobs.finalizer import ROLE as FINALIZER_ROLE  # noqa: E402
from gateway.jobs.run.spool import TEMP_DIR_PREFIX, spool_root  # noqa: E402
from gateway.model import JobRow, JobStatus  # noqa: E402
from gateway.store import open_store  # noqa: E402
from tests.fakes.fake_webhook import FakeWebhook  # noqa: E402
from tests.jobs.conftest import FAKE_COMMANDS, FAKES_BIN, FAST_LEASE, FakeLog  # noqa: E402

# -- knobs ---------------------------------------------------------------------------------

LEASE = dict(FAST_LEASE)  # heartbeat 0.2, ttl 1, grace 1, sweep 0.2, gc 1, cancel poll 0.2
# Two scenarios, by `[lease] on_shutdown`:
# - "detach" (the product's default): runs outlive their gateway's SIGTERM and SIGKILL, a
#   peer adopts or re-queues them, and with one instance always alive every job that was
#   not cancelled must end `completed` with its answer (`unfinished=0` is in the verdict).
#   No store outage: a run that ends while every gateway is cut off from the store for
#   longer than ttl is orphaned by design (nothing can prove its owner alive), which is
#   the "stop" scenario's business.
# - "stop": a SIGTERMed instance drains (its jobs end failed / shutdown), and on PostgreSQL
#   the server is stopped once; unfinished jobs are expected and only reported.
ON_SHUTDOWN_MODES = ("detach", "stop")
KILL_GRACE_S = 0.5  # SIGTERM -> SIGKILL escalation for cancelled/drained jobs
RUN_SLOTS_PER_INSTANCE = 4  # small, so bursts queue jobs and queued jobs meet the chaos too
PROVIDERS = ("claude", "codex", "gemini")  # three prompt paths: after --, stdin, --print=
ANSWER_READ_BYTES = 1 << 20  # a fake's answer is a line quoting its prompt: far less than this
PROMPT_PREFIX = "chaos"

# Bounds of the audit (see the module docstring for how each one is used).
TICK_JITTER_S = 0.5  # how late a heartbeat may commit: seen 0.34 s (load 20 on 2 cores)
CLOCK_EPSILON_S = 0.05  # driver stamps vs store timestamps (same host clock) and log latency
STORE_RECOVERY_S = 1.0  # PostgreSQL back up -> pool reconnected and a heartbeat committed
PROCESS_EXIT_SLACK_S = 1.0  # a fake CLI's interpreter start and exit around its @sleep
WATCH_S = 0.1  # how often the driver looks whether each spawned fake CLI still runs
OBSERVE_S = 0.25  # how often the driver reads every job as a poller would (to count flaps)
PID_REUSE_TOLERANCE_S = 5.0  # spawn-log time vs process start time (interpreter start-up)
LOCK_PROBE_S = 0.3  # a live SQLite writer holds the lock for ms; 0.3 s held = stopped holder

# Driver timing.
CALL_TIMEOUT_S = 2.5  # initialize, and tools/call; shorter than the longest SIGSTOP
SESSION_CLOSE_S = 3.0  # a slow but live server still gets the session's DELETE (else it
#                        counts against http.max_sessions until it idles out)
FRESH_SESSION_FRACTION = 0.2  # calls made by a brand-new client (own session); the rest share
#                               the instance's long-lived sessions, as desktop clients do
REQUEST_TIMEOUT_CODE = -32001  # MCPError code of a request whose read timeout expired
INSTANCE_READY_TIMEOUT_S = 45.0  # process start to /healthz admitting (covers the PG outage)
GATEWAY_EXIT_TIMEOUT_S = 8.0  # SIGTERM -> exit: drain 1.5 s + lease stop + uvicorn's 2 s
RESTART_DELAY_S = (0.2, 1.5)  # a supervisor restarts a dead gateway after a moment
STOP_DURATION_S = (0.3, 4.0)  # SIGSTOP lengths, below and above ttl (1 s) and the call timeout
ACTION_GAP_S = (1.5, 4.0)  # pause between two chaos actions
VICTIM_WORK_LEFT_S = 0.5  # a victim's run in flight should have this long to go, if one has
# The anchor: one job held (@until=) from the start until the chaos window closes, so the
# first fault always finds a run in flight to leave behind, however slowly a loaded box
# starts the others (at load 18 three runs in a row saw every fault miss every short run).
ANCHOR = "anchor"
ACTION_WEIGHTS = {"kill": 0.3, "stop": 0.3, "term": 0.15, "stop_kill": 0.15,
                  "zygote_kill": 0.1}
SUBMIT_ATTEMPTS = 5  # a request is retried on other instances this often
IMPATIENT_TIMEOUT_S = (0.002, 0.06)  # an impatient client's tools/call read timeout
SUBMIT_RETRY_PAUSE_S = 0.25  # after a refusal (unavailable/saturated), doubling per try
CANCEL_DELAY_S = (0.05, 1.5)  # cancels land on queued, running and finished jobs alike
SETTLE_MARGIN_S = 5.0  # beyond ttl + sweeps + the longest job: queue drain, slow restarts
# No active row changed for this long on top of the bound above: the rest is stuck, not slow
# (a 2-core box at load 19 started a fake run in 3-4 s, and a run slot waits for its end).
SETTLE_STALL_S = 20.0
SETTLE_CAP_S = 600.0  # a hard bound on settling, however steadily the backlog drains
POLL_S = 0.1

DEFAULT_JOBS = 150
# Notices (--notify): the ends that are told, the command sink, and how long the audit waits
# after settling for the last deliveries (a retry after a killed deliverer's claim lapses).
NOTIFIED = frozenset({"completed", "failed", "timed_out", "orphaned"})
NOTICE_SINK = Path(__file__).resolve().parents[1] / "tests" / "fakes" / "notice_sink.py"
NOTICE_SETTLE_S = 120.0
DEFAULT_INSTANCES = 3
DEFAULT_DURATION_S = 40.0


class ChaosError(Exception):
    """The harness itself could not do its job (an instance never became ready...)."""


class StoreControl(Protocol):
    """What the driver needs of a PostgreSQL server to simulate an outage
    (tests/conftest.py PostgresServer)."""

    def stop(self, mode: str = "immediate") -> None: ...

    def start(self) -> None: ...


@dataclass(frozen=True)
class ChaosOptions:
    backend: str  # "sqlite" | "postgres"
    workdir: Path
    jobs: int = DEFAULT_JOBS
    instances: int = DEFAULT_INSTANCES
    duration_s: float = DEFAULT_DURATION_S
    seed: int | None = None
    dsn: str | None = None  # postgres
    pooler: str = "none"  # postgres: "pgbouncer" when dsn points at PgBouncer (issue #29)
    store_control: StoreControl | None = None  # postgres: stop/start for the outage
    outage_s: float = 3.0
    sleep_s: tuple[float, float] = (0.1, 2.0)  # each fake job's @sleep range
    cancel_fraction: float = 0.15
    # Requests whose first attempt gives up almost at once (a user pressing Esc, a client
    # with a tiny tool timeout; the MCP SDK then cancels the tool coroutine mid-admission),
    # then retries patiently like any client.
    impatient_fraction: float = 0.0
    actions: bool = True  # False: no kills/stops/outages (client-side trouble only)
    on_shutdown: str = "detach"  # the gateways' [lease] on_shutdown: see ON_SHUTDOWN_MODES
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. PYTHONPATH for a mutant
    # The load scenario (issue 23): no random chaos, one SIGKILL of one instance at this
    # share of the duration (it is restarted, like any killed slot). None: the chaos monkey.
    kill_once_at: float | None = None
    # Completion notices (issue 40): a loopback webhook and a command sink on every gateway;
    # the audit counts each notified job's deliveries per sink (none lost; duplicates only
    # where a deliverer died mid-delivery, counted).
    notify: bool = False
    # With notify: the webhook is down (connection refused) for this long, from a fifth into
    # the window, with the default retry schedule (0: up throughout, generous retries).
    webhook_outage_s: float = 0.0
    # How many long-lived MCP sessions (Streamable HTTP) the driver holds with each instance
    # (the load scenario: 2 per gateway, so 2 gateways take 4 sessions), and the share of
    # calls made instead by a brand-new client of its own (0: only those sessions).
    sessions_per_instance: int = 1
    fresh_session_fraction: float = FRESH_SESSION_FRACTION
    # Jobs (of `jobs`, spread over the run) that run isolated in a scratch checkout and
    # tamper with their worktree (#38, bench/chaos_worktrees.py): the audit requires the
    # checkout untouched and nothing outside the worktrees root removed.
    tamper_worktrees: int = 0


# -- the timeline ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Gap:
    """A stretch of time during which an instance could not heartbeat."""

    start: float
    end: float  # math.inf: it never came back
    cause: str


@dataclass(eq=False)
class SharedSession:
    """One of the driver's long-lived MCP sessions with an instance (opened on first use,
    reopened after it broke)."""

    index: int
    client: Any = None
    opening: Any = None  # anyio.Event set once the open attempt is over
    scope: anyio.CancelScope | None = None
    done: Any = None  # anyio.Event: close the session politely

    def drop(self) -> None:
        """Abandon it at once (its server died or broke it)."""
        if self.scope is not None:
            self.scope.cancel()


@dataclass(eq=False)
class InstanceLife:
    """One gateway process: a slot's generation. A restart is a new life."""

    slot: int
    generation: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    spawned_at: float
    ready_at: float | None = None
    instance_id: str | None = None
    gaps: list[Gap] = field(default_factory=list)
    exited_at: float | None = None
    stopped: bool = False
    busy: bool = False  # a chaos action holds it
    final: bool = False  # stopped by the final shutdown, not by chaos
    stuck: bool = False  # needed SIGKILL after a SIGTERM
    # The driver's long-lived MCP sessions with this instance (ChaosOptions.sessions_per_instance).
    sessions: list[SharedSession] = field(default_factory=list)

    def drop_sessions(self) -> None:
        """Abandon every shared session at once (its server died)."""
        for session in self.sessions:
            session.drop()

    @property
    def name(self) -> str:
        return f"i{self.slot}.{self.generation}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def healthy(self) -> bool:
        return (self.ready_at is not None and self.exited_at is None and not self.stopped
                and not self.busy)

    @property
    def death(self) -> Gap | None:
        """The gap that never ends (it was killed or terminated), if any."""
        return next((g for g in self.gaps if math.isinf(g.end)), None)

    def describe(self, t0: float) -> str:
        """Its timeline, in seconds since the chaos started (t0)."""
        gaps = ", ".join(f"{g.cause} {rel(g.start, t0)}..{rel(g.end, t0)}" for g in self.gaps)
        return (f"{self.name} id={self.instance_id} pid={self.process.pid} "
                f"ready={rel(self.ready_at, t0)} exited={rel(self.exited_at, t0)} "
                f"gaps=[{gaps}]")


@dataclass
class Attempt:
    instance: str
    started: float
    ended: float
    outcome: str  # "ok" | "refused:<error_kind>" | "lost:<why>"
    job_id: str | None = None
    owner_instance: str | None = None
    deduplicated: bool = False


@dataclass(eq=False)
class LogicalJob:
    """One request the driver wants done: one unique prompt, retried until answered."""

    index: int
    provider: str
    sleep_s: float
    prompt: str
    arguments: dict[str, Any] = field(default_factory=dict)  # beside the prompt
    attempts: list[Attempt] = field(default_factory=list)
    job_ids: set[str] = field(default_factory=set)
    owner_instance: str | None = None
    cancels: list[Attempt] = field(default_factory=list)


@dataclass
class Spawn:
    prompt: str
    pid: int
    pgid: int
    t: float  # when it logged its spawn (after its interpreter started)
    ended: float | None = None  # when the watcher first saw it gone (or a zombie)


class ProcessWatcher:
    """Follows the fake CLIs' spawn log and notes when each of our spawns ends."""

    def __init__(self, path: Path, tag: str) -> None:
        self.path = path
        self.tag = tag
        self.offset = 0
        self.partial = b""
        self.spawns: list[Spawn] = []

    def read_new(self) -> None:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # an unfinished last line waits for the next read
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                prompt = str(entry.get("prompt", ""))
                if "argv" in entry and prompt.startswith(self.tag):
                    self.spawns.append(Spawn(prompt, int(entry["pid"]), int(entry["pgid"]),
                                             float(entry["t"])))

    def poll(self) -> None:
        self.read_new()
        now = time.time()
        for spawn in self.spawns:
            if spawn.ended is None and not process_alive(spawn.pid, spawn.t):
                spawn.ended = now

    def alive(self) -> list[Spawn]:
        return [spawn for spawn in self.spawns if spawn.ended is None]

    async def run(self) -> None:
        while True:
            self.poll()
            await anyio.sleep(WATCH_S)


@dataclass
class ChaosReport:
    backend: str
    jobs: int = 0
    completed: int = 0
    cancelled: int = 0
    orphaned: int = 0
    lost: int = 0
    false_orphans: int = 0
    late_orphans: int = 0
    duplicate_runs: int = 0
    leftover_processes: int = 0
    # What launches that never happened or runs that ended may leave (issue 23, item 12):
    # temp cwds of the gateways (their TMPDIR is the run's own) and attempt dirs of jobs
    # whose row is terminal. Part of `ok` in the detach scenario (every job is finalized).
    leftover_temp_cwds: int = 0
    leftover_attempt_dirs: int = 0
    # Jobs whose terminal status later changed (seen terminal by the observer or orphaned in
    # a log line, and different at the end): a poller that read the first one stopped.
    flapped: int = 0
    # A tamper job's escape from its worktree (#38): a commit on the user's branch, a changed
    # checkout, a directory outside the worktrees root removed.
    escapes: int = 0
    # Jobs neither cancelled nor completed (orphaned, failed: a run that did not survive its
    # gateway). Part of `ok` in the detach scenario; with on_shutdown = "stop" a SIGTERM's
    # drain fails running jobs by design, so it is only reported there.
    unfinished: int = 0
    # Notices (with ChaosOptions.notify): notified jobs missing a delivery on a sink after
    # settling (must be 0), and extra deliveries (same id twice: a deliverer died between a
    # sink's acceptance and its record; allowed, counted).
    notices_lost: int = 0
    notices_duplicated: int = 0
    require_finished: bool = True
    info: dict[str, Any] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"chaos: backend={self.backend} jobs={self.jobs} completed={self.completed} "
                f"cancelled={self.cancelled} orphaned={self.orphaned} lost={self.lost} "
                f"false_orphans={self.false_orphans} late_orphans={self.late_orphans} "
                f"duplicate_runs={self.duplicate_runs} "
                f"leftover_processes={self.leftover_processes} unfinished={self.unfinished} "
                f"leftover_temp_cwds={self.leftover_temp_cwds} "
                f"leftover_attempt_dirs={self.leftover_attempt_dirs} "
                f"flapped={self.flapped} escapes={self.escapes} "
                f"notices_lost={self.notices_lost} notices_duplicated={self.notices_duplicated}")

    def info_line(self) -> str:
        return "chaos-info: " + " ".join(f"{k}={v}" for k, v in self.info.items())

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.false_orphans == 0 and self.late_orphans == 0
                and self.duplicate_runs == 0 and self.leftover_processes == 0
                and self.flapped == 0 and self.escapes == 0 and self.notices_lost == 0
                and not (self.require_finished and self.unfinished)
                and not (self.require_finished
                         and self.leftover_temp_cwds + self.leftover_attempt_dirs)
                and not self.info.get("stuck_gateways") and not self.info.get("bad_results")
                and not self.info.get("unknown_rows"))

    def text(self) -> str:
        out = [self.line(), self.info_line()]
        if not self.ok:
            out.append("offending jobs and timelines:")
            out.extend(f"  {d}" for d in self.details)
        return "\n".join(out)


# -- the rules (pure functions of the timeline; tested on their own) -------------------------


@dataclass(frozen=True)
class Bounds:
    ttl_s: float
    heartbeat_s: float
    sweep_s: float

    @property
    def period_s(self) -> float:
        """Longest time an unimpaired instance goes without a committed heartbeat."""
        return self.heartbeat_s + TICK_JITTER_S

    @property
    def sweep_bound_s(self) -> float:
        """Longest time an available reaper takes to sweep (one skipped sweep allowed)."""
        return 2 * (self.sweep_s + TICK_JITTER_S)

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        lease = settings.lease
        return cls(ttl_s=lease.ttl_s, heartbeat_s=lease.heartbeat_s,
                   sweep_s=lease.sweep_interval_s)


def unimpaired_intervals(ready_at: float | None, gaps: Iterable[Gap]) -> list[tuple[float, float]]:
    """The stretches from ready_at on during which the instance was not impaired."""
    if ready_at is None:
        return []
    intervals: list[tuple[float, float]] = []
    cursor = ready_at
    for gap in sorted(gaps, key=lambda g: g.start):
        if gap.end <= cursor:
            continue
        if gap.start > cursor:
            intervals.append((cursor, gap.start))
        cursor = max(cursor, gap.end)
        if math.isinf(cursor):
            return intervals
    intervals.append((cursor, math.inf))
    return intervals


def lease_valid_until(created: float, started: float | None, orphaned_at: float,
                      intervals: Sequence[tuple[float, float]], bounds: Bounds) -> float:
    """The latest moment up to which the job's lease was provably valid, judged at
    `orphaned_at` from its owner's unimpaired stretches (see the module docstring)."""
    valid = created + bounds.ttl_s
    if started is not None:
        valid = max(valid, started + bounds.ttl_s)
    for u0, u1 in intervals:
        a, b = max(u0, created), min(u1, orphaned_at)
        if b - a >= bounds.period_s:
            valid = max(valid, b - bounds.period_s + bounds.ttl_s)
    return valid


def is_false_orphan(created: float, started: float | None, orphaned_at: float,
                    intervals: Sequence[tuple[float, float]], bounds: Bounds) -> bool:
    valid = lease_valid_until(created, started, orphaned_at, intervals, bounds)
    return orphaned_at < valid - CLOCK_EPSILON_S


def first_reaper(t: float, reapers: Iterable[Sequence[tuple[float, float]]],
                 bounds: Bounds) -> float:
    """The first moment >= t at which some instance has been unimpaired for a heartbeat
    period and stays unimpaired long enough to sweep (math.inf if none)."""
    best = math.inf
    for intervals in reapers:
        for u0, u1 in intervals:
            candidate = max(t, u0 + bounds.period_s)
            if candidate + bounds.sweep_bound_s <= u1:
                best = min(best, candidate)
    return best


def stopped_time(a: float, b: float, stops: Iterable[Gap]) -> float:
    """Length of the union of SIGSTOP gaps (any instance) inside [a, b]."""
    pieces = sorted((max(a, g.start), min(b, g.end)) for g in stops
                    if g.end > a and g.start < b)
    total, cursor = 0.0, a
    for s, e in pieces:
        s = max(s, cursor)
        if e > s:
            total += e - s
            cursor = e
    return total


def orphan_deadline(death: float, process_exit: float | None,
                    reapers: Iterable[Sequence[tuple[float, float]]], stops: Sequence[Gap],
                    bounds: Bounds) -> float:
    """By when a job of an owner that died at `death` must be terminal (module docstring)."""
    base = max(death + bounds.ttl_s, process_exit if process_exit is not None else -math.inf)
    plain = first_reaper(base, list(reapers), bounds) + bounds.sweep_bound_s
    if math.isinf(plain):
        return plain
    # A stopped instance may hold a lock the sweep needs: stretch the window by the time
    # instances spent stopped inside it, to a fixed point (a longer window may take in
    # another stop; the total stopped time is finite, so this converges).
    deadline = plain
    for _ in range(100):
        stretched = plain + stopped_time(death, deadline, stops)
        if stretched <= deadline + 1e-9:
            break
        deadline = stretched
    return deadline


def excess_spawns(spawns: int, ran: int) -> int:
    """Spawns beyond the number of queued -> running permits of that prompt's rows."""
    return max(0, spawns - ran)


# -- helpers -------------------------------------------------------------------------------


def tightest(margins: Sequence[tuple[float, str]]) -> str:
    """The smallest margin and its job (first 8 characters of the id), for the info line."""
    if not margins:
        return "-"
    value, job_id = min(margins)
    return f"{value:.3f}({job_id[:8]})"


def rel(t: float | None, t0: float) -> str:
    """A time as seconds since t0 (the start of the chaos), for reports."""
    if t is None:
        return "-"
    return "never" if math.isinf(t) else f"{t - t0:+.3f}"


def epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def describe_error(exc: BaseException) -> str:
    """A short name for a failed call, flattening exception groups."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    def name(e: BaseException) -> str:
        code = getattr(getattr(e, "error", None), "code", None)  # MCPError: which one
        return f"{type(e).__name__}({code})" if code is not None else type(e).__name__

    walk(exc)
    return ";".join(sorted({name(e) for e in leaves})) or type(exc).__name__


def row_prompt(row: JobRow) -> str | None:
    try:
        return str(json.loads(row.request_json).get("prompt"))
    except (ValueError, AttributeError):
        return None


def process_alive(pid: int, started: float) -> bool:
    """pid runs, is not a zombie, and started near `started` (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - started) < PID_REUSE_TOLERANCE_S
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def log_times(path: Path) -> list[float]:
    """Timestamps of every JSON line a gateway logged (sorted)."""
    times = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                times.append(datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp())
    return sorted(times)


def longest_silence(times: Sequence[float], a: float, b: float) -> float:
    """The longest stretch inside [a, b] without a log line: a stalled event loop (CPU
    starvation, a blocked store call) shows up as silence in a busy gateway's log."""
    inside = [t for t in times if a <= t <= b]
    edges = [a, *inside, b]
    return max((y - x for x, y in itertools.pairwise(edges)), default=b - a)


def parse_orphan_events(
    paths: Iterable[Path],
) -> dict[str, list[tuple[float, str, str | None]]]:
    """job_id -> [(time, reaper log file, owner then)] of every "job orphaned" line in the
    gateway logs. A job may be orphaned more than once (re-queued or adopted in between,
    by another owner each time): each orphaning is judged with its own owner and time."""
    events: dict[str, list[tuple[float, str, str | None]]] = defaultdict(list)
    for path in paths:
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if '"recover_expired_leases"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                job_id, stamp = record.get("job_id"), record.get("timestamp")
                if not job_id or not stamp:
                    continue
                t = datetime.fromisoformat(stamp).timestamp()
                events[job_id].append((t, path.stem, record.get("owner_instance")))
    return events


# -- the run -------------------------------------------------------------------------------


def count_log_events(paths: Iterable[Path], events: Sequence[str],
                     summed: Mapping[str, str] | None = None) -> Counter[str]:
    """How many gateway log lines carry each of these events (adoptions, re-queues...);
    for an event in `summed`, also the sum of that field over its lines, as
    `"<event>.<field>"` (the runs each detach left behind)."""
    counts: Counter[str] = Counter({event: 0 for event in events})
    fields = dict(summed or {})
    for path in paths:
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    record = json.loads(line)
                    event = record.get("event")
                    if event in counts:
                        counts[event] += 1
                    if event in fields:
                        counts[f"{event}.{fields[event]}"] += int(record.get(fields[event]) or 0)
    return counts


# How long a terminal job's attempt dir may take to go after its terminal row (its remover
# runs right after the write; a loaded box delays it by seconds, never by this much).
ATTEMPT_DIR_GRACE_S = 15.0

class ChaosRun:
    def __init__(self, options: ChaosOptions) -> None:
        if options.backend not in ("sqlite", "postgres"):
            raise ValueError("backend must be sqlite or postgres")
        if options.backend == "postgres" and not options.dsn:
            raise ValueError("the postgres backend needs a dsn")
        if options.on_shutdown not in ON_SHUTDOWN_MODES:
            raise ValueError(f"on_shutdown must be one of {ON_SHUTDOWN_MODES}")
        if options.instances < 2:
            raise ValueError("at least 2 instances: one must always be there to reap")
        if options.sessions_per_instance < 0:
            raise ValueError("sessions_per_instance must be >= 0")
        self.o = options
        self.rng = random.Random(options.seed)
        self.tag = f"{PROMPT_PREFIX}-{uuid.uuid4().hex[:8]}"
        self.workdir = options.workdir
        self.logs_dir = self.workdir / "logs"
        self.fake_log = FakeLog(self.workdir / "fake-cli.log")
        self.watcher = ProcessWatcher(self.fake_log.path, self.tag)
        self.config_path = self.workdir / "config.toml"
        self.db_path = self.workdir / "state" / "jobs.db"
        self.notice_log = self.workdir / "notices.jsonl"
        self.webhook = FakeWebhook()  # started only with --notify
        self.notice_counts = (0, 0)
        self.notices_expected = 0
        self.notices_retried = 0
        self.tmp_dir = self.workdir / "tmp"
        self.lives: list[InstanceLife] = []
        self.slots: list[InstanceLife | None] = [None] * options.instances
        self.generations = [0] * options.instances
        self.jobs: list[LogicalJob] = []
        self.store_gaps: list[Gap] = []  # impair every instance
        self.stops: list[Gap] = []  # every SIGSTOP gap, any instance
        self.actions: Counter[str] = Counter()
        self.harness_notes: list[str] = []
        # Answers per long-lived session (slot, index): which sessions drove the run. A
        # restarted slot's new sessions count as the same ones: a client reconnecting.
        self.session_answers: Counter[tuple[int, int]] = Counter()
        self.sessions_opened = 0  # long-lived sessions opened (reopened after a kill too)
        self.fresh_clients = 0  # calls made through a brand-new client instead
        self.active_after_settle: set[str] = set()
        self.settle_s = 0.0
        # job id -> (the first terminal status the observer read, when): what a poller saw.
        self.seen_terminal: dict[str, tuple[str, float]] = {}
        self.observed_flaps: dict[str, str] = {}  # job id -> "status@t -> status@t"
        self.store_down = False
        self.max_impaired = max(1, (options.instances - 1) // 2)
        # Every kind of action happens at least once, then by weight. The first is a
        # stop_kill (popped from the end): a loaded box may fit a single action into a short
        # run, and that one both stops a gateway past its lease and kills it, which is what
        # the scenarios' checks need to have happened; then a zygote_kill (the runs of a
        # live gateway lose their zygote: issue 26); the others follow in random order.
        rest = [kind for kind in ACTION_WEIGHTS if kind not in ("stop_kill", "zygote_kill")]
        self.rng.shuffle(rest)
        self.deck = [*rest, "zygote_kill", "stop_kill"]
        self.settings: Settings | None = None
        self.tamper: TamperScene | None = None
        self.tamper_info: dict[str, Any] = {}
        self.tamper_every = max(1, options.jobs // max(1, options.tamper_worktrees))
        self.tg: Any = None
        self.t0 = 0.0
        self.anchor_gate = self.workdir / "anchor.go"
        self.anchor = LogicalJob(-1, PROVIDERS[0], math.inf,
                                 f"{self.tag}-{ANCHOR} @until={self.anchor_gate}")

    # -- setup ---------------------------------------------------------------------------
    def write_config(self) -> Settings:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        (self.workdir / "home").mkdir(exist_ok=True)
        self.tmp_dir.mkdir(mode=0o700, exist_ok=True)
        persistence: dict[str, Any] = {"backend": self.o.backend}
        if self.o.backend == "postgres":
            persistence["dsn"] = self.o.dsn
            persistence["pooler"] = self.o.pooler
        else:
            self.db_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            persistence["path"] = str(self.db_path)
        env = {"FAKE_CLI_LOG": str(self.fake_log.path)}
        config = {
            "persistence": persistence,
            "lease": {**LEASE, "on_shutdown": self.o.on_shutdown},
            # A queued job waits for a slot as long as settling waits for it: the audit is
            # about losing jobs, and a loaded box (load 23 on 2 cores) drained 200 jobs on
            # 2 gateways slower than the default 120 s queue_timeout_s fails them.
            "limits": {"kill_grace_s": KILL_GRACE_S,
                       "max_running_jobs": RUN_SLOTS_PER_INSTANCE,
                       "max_running_per_provider": RUN_SLOTS_PER_INSTANCE,
                       "queue_timeout_s": SETTLE_CAP_S},
            "logging": {"format": "json", "level": "info"},
            "providers": {
                name: ({"command": str(FAKES_BIN / binary), "env": env} if name in PROVIDERS
                       else {"enabled": False})
                for name, binary in FAKE_COMMANDS.items()},
        }
        if self.o.notify:
            self.webhook = FakeWebhook()
            self.webhook.start()
            config["notify"] = {
                "webhook_url": self.webhook.url, "min_duration_s": 0,
                "timeout_s": 5, "on": ["completed", "failed", "timed_out", "orphaned"],
                "command": [sys.executable, str(NOTICE_SINK), str(self.notice_log),
                            "{id}"]}
            if not self.o.webhook_outage_s:  # killed deliverers' lapsed claims count too
                config["notify"]["max_attempts"] = 50
        if self.o.tamper_worktrees:
            self.tamper = TamperScene.prepare(self.workdir)
            config["worktrees"] = {"root": str(self.workdir / "worktrees")}
        self.config_path.write_text(tomli_w.dumps(config))
        settings = load_settings(path=self.config_path)
        self.settings = settings
        return settings

    def gateway_state_dir(self) -> Path:
        """The gateways' state dir (settings.state_dir as their HOME makes it)."""
        if self.o.backend == "sqlite":
            return self.db_path.parent
        return self.workdir / "home" / ".agent-cli-gateway"

    def gateway_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_GATEWAY_")}
        env["AGENT_GATEWAY_CONFIG"] = str(self.config_path)
        env["HOME"] = str(self.workdir / "home")
        # The fake CLIs start with `env python3`: this interpreter's directory first keeps
        # that fast (tests/fakes/README.md).
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = str(self.tmp_dir)  # the runs' temp cwds, counted by the audit
        env.update(self.o.extra_env)
        return env

    # -- instances -----------------------------------------------------------------------
    async def spawn(self, slot: int) -> InstanceLife:
        """Start a gateway in `slot` on a new port and wait until it admits jobs."""
        for _ in range(3):  # a free port can be taken between probing and binding
            self.generations[slot] += 1
            port = free_port()
            name = f"i{slot}.{self.generations[slot]}"
            log_path = self.logs_dir / f"{name}.log"
            log_file = log_path.open("wb")
            try:
                process = subprocess.Popen(
                    [sys.executable, "-m", "gateway", "serve", "--transport", "http",
                     "--host", "127.0.0.1", "--port", str(port), "--no-auth"],
                    cwd=REPO_ROOT, env=self.gateway_env(), stdin=subprocess.DEVNULL,
                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                log_file.close()
            life = InstanceLife(slot=slot, generation=self.generations[slot], port=port,
                                process=process, log_path=log_path, spawned_at=time.time(),
                                sessions=[SharedSession(i) for i in
                                          range(self.o.sessions_per_instance)])
            self.lives.append(life)
            if await self.wait_ready(life):
                self.slots[slot] = life
                return life
            self.harness_notes.append(f"{life.name} did not become ready; retried")
            await self.hard_kill(life, "failed_start")
        raise ChaosError(f"slot {slot}: no gateway became ready in 3 attempts; "
                         f"see {self.logs_dir}")

    async def wait_ready(self, life: InstanceLife) -> bool:
        url = f"http://127.0.0.1:{life.port}/healthz"
        with anyio.move_on_after(INSTANCE_READY_TIMEOUT_S):
            async with httpx2.AsyncClient(timeout=1.0) as http:
                while life.process.poll() is None:
                    with contextlib.suppress(Exception):
                        answer = (await http.get(url)).json()
                        if answer.get("ready") and answer.get("admitting"):
                            life.ready_at = time.time()
                            life.instance_id = self.instance_id_of(life)
                            return life.instance_id is not None
                    await anyio.sleep(POLL_S)
        return False

    @staticmethod
    def instance_id_of(life: InstanceLife) -> str | None:
        """The instance id the gateway logged when it became ready (logged before /healthz
        can say ready: both happen in one step of the event loop)."""
        with contextlib.suppress(OSError):
            for line in life.log_path.read_text(errors="replace").splitlines():
                if '"gateway ready"' in line:
                    with contextlib.suppress(ValueError):
                        return str(json.loads(line)["instance_id"])
        return None

    async def wait_exit(self, life: InstanceLife, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            while life.process.poll() is None:
                await anyio.sleep(0.02)
            life.exited_at = time.time()
            return True
        return False

    async def hard_kill(self, life: InstanceLife, cause: str) -> None:
        now = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(life.process.pid, signal.SIGKILL)
        life.drop_sessions()
        if life.death is None:
            life.gaps.append(Gap(now, math.inf, cause))
        if not await self.wait_exit(life, 10.0):
            raise ChaosError(f"{life.name} (pid {life.process.pid}) survived SIGKILL")

    async def terminate(self, life: InstanceLife, cause: str) -> None:
        """SIGTERM (drain) and wait; SIGKILL and flag it if it does not exit in time."""
        await self.close_sessions(life)
        life.gaps.append(Gap(time.time(), math.inf, cause))
        with contextlib.suppress(ProcessLookupError):
            os.kill(life.process.pid, signal.SIGTERM)
        if not await self.wait_exit(life, GATEWAY_EXIT_TIMEOUT_S):
            life.stuck = True
            await self.hard_kill(life, cause)

    def stop(self, life: InstanceLife) -> float:
        now = time.time()
        os.kill(life.process.pid, signal.SIGSTOP)
        life.stopped = True
        return now

    def cont(self, life: InstanceLife, stopped_at: float, global_stall: bool) -> None:
        now = time.time()
        os.kill(life.process.pid, signal.SIGCONT)
        life.stopped = False
        gap = Gap(stopped_at, now, "sigstop")
        life.gaps.append(gap)
        self.stops.append(gap)
        if global_stall:
            self.store_gaps.append(Gap(stopped_at, now, f"sqlite_lock_held_by_{life.name}"))

    def sqlite_lock_held(self) -> bool:
        """True when no one can take the SQLite write lock for LOCK_PROBE_S (a stopped
        process holds it: a live one releases it within milliseconds)."""
        if self.o.backend != "sqlite":
            return False
        try:
            conn = sqlite3.connect(self.db_path, timeout=LOCK_PROBE_S, isolation_level=None)
        except sqlite3.Error:
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()

    def current(self) -> list[InstanceLife]:
        return [life for life in self.slots if life is not None and life.exited_at is None]

    # -- MCP calls -----------------------------------------------------------------------
    async def call(self, life: InstanceLife, tool: str, args: dict[str, Any],
                   tool_timeout: float | None = None) -> Attempt:
        """One real MCP tool call, bounded; never raises. Most go through one of the
        instance's long-lived sessions (at random), some (fresh_session_fraction) through a
        brand-new client. `tool_timeout` bounds the tools/call alone (a session is set up
        with the normal timeout)."""
        if life.sessions and self.rng.random() >= self.o.fresh_session_fraction:
            shared = self.rng.choice(life.sessions)
            return await self.call_shared(life, shared, tool, args, tool_timeout)
        started = time.time()
        result: Any = None
        error = "timeout"
        self.fresh_clients += 1
        with anyio.move_on_after(2 * CALL_TIMEOUT_S + SESSION_CLOSE_S):
            try:
                async with Client(life.url, mode="legacy",
                                  read_timeout_seconds=CALL_TIMEOUT_S) as client:
                    result = await client.call_tool(
                        tool, args, read_timeout_seconds=tool_timeout or CALL_TIMEOUT_S)
            except Exception as exc:
                error = describe_error(exc)
        # The session's close may fail after the answer: the answer counts.
        return self.attempt(life, started, result, error)

    async def call_shared(self, life: InstanceLife, shared: SharedSession, tool: str,
                          args: dict[str, Any], tool_timeout: float | None) -> Attempt:
        started = time.time()
        result: Any = None
        error = "timeout"
        with anyio.move_on_after(2 * CALL_TIMEOUT_S + 1.0):
            client = await self.shared_client(life, shared)
            if client is None:
                error = "no_session"
            else:
                try:
                    result = await client.call_tool(
                        tool, args, read_timeout_seconds=tool_timeout or CALL_TIMEOUT_S)
                except Exception as exc:
                    error = describe_error(exc)
                    if f"({REQUEST_TIMEOUT_CODE})" not in error:
                        shared.drop()  # broken, not just slow: the next call reopens it
        if result is not None:
            self.session_answers[(life.slot, shared.index)] += 1
        return self.attempt(life, started, result, error)

    async def shared_client(self, life: InstanceLife, shared: SharedSession) -> Any:
        """The long-lived session's client, opening it if needed (None if it cannot)."""
        if shared.client is not None:
            return shared.client
        if shared.opening is None:
            shared.opening = anyio.Event()
            self.tg.start_soon(self.hold_session, life, shared, shared.opening)
        await shared.opening.wait()
        return shared.client

    async def hold_session(self, life: InstanceLife, shared: SharedSession,
                           opened: Any) -> None:
        """Keep one MCP session with `life` open until it is closed, dropped or broken."""
        shared.done = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                shared.scope = scope
                async with Client(life.url, mode="legacy",
                                  read_timeout_seconds=CALL_TIMEOUT_S) as client:
                    shared.client = client
                    self.sessions_opened += 1
                    opened.set()
                    await shared.done.wait()
        except Exception:
            pass
        finally:
            shared.client = None
            shared.scope = None
            shared.opening = None
            opened.set()

    async def close_sessions(self, life: InstanceLife) -> None:
        """Close the shared sessions politely (DELETE), or abandon them after a while."""
        open_ones = [s for s in life.sessions if s.done is not None and s.scope is not None]
        for shared in open_ones:
            shared.done.set()
        with anyio.move_on_after(SESSION_CLOSE_S):
            while any(shared.scope is not None for shared in open_ones):
                await anyio.sleep(0.02)
        life.drop_sessions()

    def attempt(self, life: InstanceLife, started: float, result: Any, error: str) -> Attempt:
        ended = time.time()
        if result is None:
            return Attempt(life.name, started, ended, f"lost:{error}")
        data = result.structured_content or {}
        if result.is_error:
            return Attempt(life.name, started, ended, f"refused:{data.get('error_kind')}")
        return Attempt(life.name, started, ended, "ok", job_id=data.get("job_id"),
                       owner_instance=data.get("owner_instance"),
                       deduplicated=bool(data.get("deduplicated")))

    def pick(self, exclude: set[str]) -> InstanceLife | None:
        """A random current instance (stopped ones too: clients do not know), preferring
        ones this request has not tried yet."""
        candidates = [life for life in self.current() if life.ready_at is not None]
        fresh = [life for life in candidates if life.name not in exclude]
        pool = fresh or candidates
        return self.rng.choice(pool) if pool else None

    async def submit(self, job: LogicalJob) -> None:
        tried: set[str] = set()
        pause = SUBMIT_RETRY_PAUSE_S
        impatient = self.rng.random() < self.o.impatient_fraction
        for _ in range(SUBMIT_ATTEMPTS):
            life = self.pick(tried)
            if life is None:
                await anyio.sleep(pause)
                continue
            tried.add(life.name)
            attempt = await self.call(
                life, f"{job.provider}_request_async", {"prompt": job.prompt, **job.arguments},
                tool_timeout=self.rng.uniform(*IMPATIENT_TIMEOUT_S) if impatient else None)
            if impatient and attempt.outcome.startswith("lost"):
                attempt.outcome = "lost:impatient"
            impatient = False
            job.attempts.append(attempt)
            if attempt.outcome == "ok" and attempt.job_id:
                job.job_ids.add(attempt.job_id)
                job.owner_instance = attempt.owner_instance
                break
            if attempt.outcome.startswith("refused"):
                await anyio.sleep(pause)  # a client backs off from a refusing gateway
                pause *= 2
        if job.job_ids and job is not self.anchor \
                and self.rng.random() < self.o.cancel_fraction:
            await anyio.sleep(self.rng.uniform(*CANCEL_DELAY_S))
            await self.cancel(job)

    async def cancel(self, job: LogicalJob) -> None:
        """Cancel through an instance that does not own the job."""
        job_id = next(iter(job.job_ids))
        owner = job.owner_instance
        for _ in range(2):
            others = [life for life in self.current()
                      if life.ready_at is not None and life.instance_id != owner]
            if not others:
                return
            attempt = await self.call(self.rng.choice(others), "llm_job_cancel",
                                      {"job_id": job_id})
            job.cancels.append(attempt)
            if attempt.outcome == "ok":
                return

    # -- the driver ----------------------------------------------------------------------
    async def submitter(self) -> None:
        window = max(1.0, self.o.duration_s - self.o.sleep_s[1])
        lo, hi = self.o.sleep_s
        async with anyio.create_task_group() as tg:
            self.jobs.append(self.anchor)
            tg.start_soon(self.submit, self.anchor)
            for index in range(self.o.jobs):
                due = self.t0 + window * index / max(1, self.o.jobs)
                await anyio.sleep(max(0.0, due - time.time()))
                provider = PROVIDERS[index % len(PROVIDERS)]
                sleep_s = round(self.rng.uniform(lo, hi), 2)
                prompt = f"{self.tag}-{index:05d} @sleep={sleep_s:.2f}"
                arguments: dict[str, Any] = {}
                if self.tamper is not None and index % self.tamper_every == 0 \
                        and len(self.tamper.kinds_used) < self.o.tamper_worktrees:
                    directive, arguments = self.tamper.request(len(self.tamper.kinds_used))
                    prompt = f"{prompt} {directive}"
                job = LogicalJob(index, provider, sleep_s, prompt, arguments)
                self.jobs.append(job)
                tg.start_soon(self.submit, job)

    async def chaos_monkey(self) -> None:
        end = self.t0 + self.o.duration_s
        outage_at = None
        if (self.o.backend == "postgres" and self.o.store_control is not None
                and self.o.on_shutdown == "stop"):
            outage_at = self.t0 + self.o.duration_s * 0.45
        # The first fault waits (within the window) for the anchor's run: victim() then
        # aims it at the anchor's owner, so it surely leaves a run behind.
        running = {spawn.prompt for spawn in self.watcher.alive()}
        while self.anchor.prompt not in running and time.time() < end - self.o.sleep_s[1]:
            await anyio.sleep(POLL_S)
            running = {spawn.prompt for spawn in self.watcher.alive()}
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(self.rng.uniform(*ACTION_GAP_S))
                if time.time() >= end - self.o.sleep_s[1]:
                    break
                if outage_at is not None and time.time() >= outage_at:
                    outage_at = None
                    await self.store_outage()
                    continue
                impaired = [s for s in self.slots if s is None or not s.healthy]
                if len(impaired) >= self.max_impaired:
                    continue
                healthy = [s for s in self.slots if s is not None and s.healthy]
                if not healthy:
                    continue
                kinds, weights = zip(*ACTION_WEIGHTS.items(), strict=True)
                kind = self.deck.pop() if self.deck else self.rng.choices(kinds, weights)[0]
                target = self.victim(healthy)
                target.busy = True
                tg.start_soon(self.act, kind, target)

    def victim(self, healthy: list[InstanceLife]) -> InstanceLife:
        """The anchor's owner while it runs the anchor (the first fault), else a random
        healthy instance, one with a run in flight if there is one, and better one whose
        run has a while to go: a fault that finds no work to leave behind proves
        nothing (on a loaded box a run may get a single action, see the detach scenario's
        take-over check), and since the zygote a run that is about to end did end before
        the signal landed (the portable detach run, CI)."""
        now = time.time()
        started = {spawn.prompt: spawn.t for spawn in self.watcher.alive()}
        working: set[str | None] = set()
        lasting: set[str | None] = set()
        for job in self.jobs:
            if job.prompt in started:
                working.add(job.owner_instance)
                if started[job.prompt] + job.sleep_s - now >= VICTIM_WORK_LEFT_S:
                    lasting.add(job.owner_instance)
        anchor_owner = {self.anchor.owner_instance} if self.anchor.prompt in started else set()
        for owners in (anchor_owner, lasting, working):
            picked = [life for life in healthy if life.instance_id in owners]
            if picked:
                return self.rng.choice(picked)
        return self.rng.choice(healthy)

    async def kill_once(self, at: float) -> None:
        """The load scenario's one fault: SIGKILL a random instance mid-way, then restart it."""
        await anyio.sleep(max(0.0, self.t0 + self.o.duration_s * at - time.time()))
        healthy = [s for s in self.slots if s is not None and s.healthy]
        if healthy:
            target = self.victim(healthy)
            target.busy = True
            await self.act("kill", target)

    async def act(self, kind: str, life: InstanceLife) -> None:
        if kind == "zygote_kill":  # the gateway lives on: nothing to restart
            self.actions[kind if self.kill_zygote(life) else "no_zygote"] += 1
            life.busy = False
            return
        self.actions[kind] += 1
        if kind in ("stop", "stop_kill"):
            stopped_at = self.stop(life)
            # Does the stopped process hold the SQLite write lock (everyone's writes stall)?
            held = await anyio.to_thread.run_sync(self.sqlite_lock_held)
            if held:
                self.actions["sqlite_lock_stall"] += 1
            await anyio.sleep(self.rng.uniform(*STOP_DURATION_S))
            if kind == "stop":
                self.cont(life, stopped_at, held)
                life.busy = False
                return
            # stop_kill: the gap that started at SIGSTOP never ends.
            if held:
                self.store_gaps.append(Gap(stopped_at, time.time(), f"sqlite_lock_held_by_{life.name}"))
            life.gaps.append(Gap(stopped_at, math.inf, "sigstop+sigkill"))
            self.stops.append(Gap(stopped_at, time.time(), "sigstop"))
            await self.hard_kill(life, "sigstop+sigkill")
        elif kind == "kill":
            await self.hard_kill(life, "sigkill")
        else:
            await self.terminate(life, "sigterm")
        await anyio.sleep(self.rng.uniform(*RESTART_DELAY_S))
        await self.spawn(life.slot)

    def kill_zygote(self, life: InstanceLife) -> bool:
        """SIGKILL the instance's zygote (gateway/jobs/run/zygote.py), its child with
        `import zygote` on its command line; False when it has none (no run yet)."""
        try:
            children = psutil.Process(life.process.pid).children()
        except psutil.Error:
            return False
        for child in children:
            try:
                if any("import zygote" in arg for arg in child.cmdline()):
                    child.kill()
                    return True
            except psutil.Error:
                continue
        return False

    async def store_outage(self) -> None:
        control = self.o.store_control
        assert control is not None
        self.actions["store_outage"] += 1
        down = time.time()
        self.store_down = True
        await anyio.to_thread.run_sync(control.stop)
        await anyio.sleep(self.o.outage_s)
        await anyio.to_thread.run_sync(control.start)
        self.store_down = False
        self.store_gaps.append(Gap(down, time.time() + STORE_RECOVERY_S, "store_outage"))

    async def settle(self, settings: Settings) -> None:
        """Wait until every row is terminal, while the active rows make progress: give up
        once none of them changed (status, start) for ttl + sweeps + the longest job +
        margins, or after SETTLE_CAP_S (ending early changes nothing: a terminal row stays
        terminal). Progress, not an estimate of the time, so a loaded box that runs the
        backlog slowly still settles, and a job that never moves is still found lost."""
        bounds = Bounds.of(settings)
        stall_s = (bounds.ttl_s + 2 * bounds.sweep_bound_s + self.o.sleep_s[1]
                   + PROCESS_EXIT_SLACK_S + SETTLE_MARGIN_S + SETTLE_STALL_S)
        started = last_change = time.time()
        store = await open_store(settings)
        seen: dict[str, tuple[str, datetime | None]] | None = None
        try:
            while True:
                rows = await store.list_jobs(limit=1_000_000, with_output=False)
                now = time.time()
                state = {r.id: (str(r.status), r.started_at) for r in rows
                         if r.status.is_active}
                if state != seen:
                    seen, last_change = state, now
                if not state or now - last_change > stall_s or now - started > SETTLE_CAP_S:
                    break
                await anyio.sleep(0.25)
        finally:
            await store.close()
        self.active_after_settle = set(state)
        self.settle_s = time.time() - started

    async def observe_terminal(self, settings: Settings) -> None:
        """Read every job as a poller would, every OBSERVE_S, for the whole run: the first
        terminal status of each job is what a client that stopped polling then believes.
        Runs until cancelled; a read that fails (the store is down) is simply skipped."""
        store = None
        try:
            while True:
                await anyio.sleep(OBSERVE_S)
                try:
                    if store is None:
                        store = await open_store(settings)
                    rows = await store.list_jobs(limit=1_000_000, with_output=False)
                except Exception:
                    if store is not None:
                        with contextlib.suppress(Exception):
                            await store.close()
                    store = None
                    continue
                now = time.time()
                for row in rows:
                    if not row.status.is_terminal:
                        if row.id in self.seen_terminal:
                            self.note_flap(row.id, str(row.status), now)
                        continue
                    first = self.seen_terminal.setdefault(row.id, (str(row.status), now))
                    if first[0] != str(row.status):
                        self.note_flap(row.id, str(row.status), now)
        finally:
            # It ends by cancellation: unshielded, the close would be cancelled too, and the
            # store's worker thread (aiosqlite) would keep the interpreter from exiting.
            if store is not None:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await store.close()

    def note_flap(self, job_id: str, status: str, at: float) -> None:
        first, seen_at = self.seen_terminal[job_id]
        self.observed_flaps.setdefault(
            job_id, f"{first}@{rel(seen_at, self.t0)} -> {status}@{rel(at, self.t0)}")

    async def shutdown(self) -> None:
        for life in self.current():
            life.final = True
        async with anyio.create_task_group() as tg:
            for life in self.current():
                tg.start_soon(self.terminate, life, "final_sigterm")

    async def wait_fakes_gone(self) -> list[Spawn]:
        """Crash-surviving fake CLIs end on their own: wait for the longest one."""
        deadline = time.time() + self.o.sleep_s[1] + PROCESS_EXIT_SLACK_S + KILL_GRACE_S
        while True:
            self.watcher.poll()
            alive = self.watcher.alive()
            if not alive or time.time() > deadline:
                return alive
            await anyio.sleep(WATCH_S)

    def spawns(self) -> list[Spawn]:
        self.watcher.read_new()
        return list(self.watcher.spawns)

    def cleanup(self) -> None:
        """Whatever happened: no gateway, fake CLI or stopped database left behind."""
        for life in self.lives:
            if life.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(life.process.pid, signal.SIGCONT)
                    os.kill(life.process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    life.process.wait(5)
        for spawn in self.spawns():
            if process_alive(spawn.pid, spawn.t):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(spawn.pgid, signal.SIGKILL)
        if self.store_down and self.o.store_control is not None:
            with contextlib.suppress(Exception):
                self.o.store_control.start()

    async def execute(self) -> ChaosReport:
        settings = self.write_config()
        async with anyio.create_task_group() as tg:
            for slot in range(self.o.instances):
                tg.start_soon(self.spawn, slot)
        self.t0 = time.time()
        async with anyio.create_task_group() as outer:
            self.tg = outer  # the driver's long-lived sessions live here
            outer.start_soon(self.watcher.run)
            outer.start_soon(self.observe_terminal, settings)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.submitter)
                if self.o.notify and self.o.webhook_outage_s:
                    tg.start_soon(self.webhook_outage)
                if self.o.kill_once_at is not None:
                    tg.start_soon(self.kill_once, self.o.kill_once_at)
                elif self.o.actions:
                    tg.start_soon(self.chaos_monkey)
            # Every act has finished: stopped instances got SIGCONT, dead slots run again.
            chaos_end = time.time()
            self.anchor_gate.touch()  # the anchor's run may end now
            await self.settle(settings)
            if self.o.notify:
                await self.settle_notices(settings)
            await self.shutdown()
            leftovers = await self.wait_fakes_gone()
            outer.cancel_scope.cancel()
        report = await self.audit(settings, leftovers)
        if self.o.notify:
            self.webhook.stop()
            report.notices_lost, report.notices_duplicated = self.notice_counts
            report.info["notices_expected"] = self.notices_expected
            report.info["notices_retried"] = self.notices_retried
        report.info.update(self.tamper_info)
        report.info["chaos_s"] = round(chaos_end - self.t0, 1)
        report.info["settle_s"] = round(self.settle_s, 1)
        return report

    async def webhook_outage(self) -> None:
        """The webhook receiver down (its port refuses connections) for webhook_outage_s,
        from a fifth into the window, then up again on the same port."""
        await anyio.sleep(max(0.0, self.t0 + self.o.duration_s * 0.2 - time.time()))
        self.webhook.stop()
        await anyio.sleep(self.o.webhook_outage_s)
        self.webhook.start()
        self.actions["webhook_outage"] += 1

    async def settle_notices(self, settings: Settings) -> None:
        """Wait (bounded) until every notice of a notified end is delivered to both sinks,
        then count what is missing and what came twice."""
        store = await open_store(settings)
        try:
            deadline = time.monotonic() + NOTICE_SETTLE_S
            while True:
                notices = await store.list_notices(limit=100_000)
                wanted = {n.id for n in notices if n.status in NOTIFIED}
                hooked = Counter(self.webhook.ids())
                commanded = Counter(self.notice_log_ids())
                missing = [i for i in wanted if not hooked[i] or not commanded[i]]
                if not missing or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.2)
        finally:
            await store.close()
        self.notices_expected = len(wanted)
        # Delivered after a failed try (the webhook was down when they were first sent).
        self.notices_retried = sum(1 for n in notices if n.status in NOTIFIED and n.attempts > 1)
        duplicated = sum(max(hooked[i] - 1, 0) + max(commanded[i] - 1, 0) for i in wanted)
        self.notice_counts = (len(missing), duplicated)

    def notice_log_ids(self) -> list[str]:
        if not self.notice_log.exists():
            return []
        return [json.loads(line)["notice"]["id"]
                for line in self.notice_log.read_text().splitlines() if line.strip()]

    def dump_timeline(self) -> None:
        """The driver's own record (instances, gaps, stalls, attempts) beside the logs, for
        a post-mortem of a kept work dir."""
        data = {
            "t0": self.t0,
            "instances": [{"name": life.name, "instance_id": life.instance_id,
                           "pid": life.process.pid, "port": life.port,
                           "ready_at": life.ready_at, "exited_at": life.exited_at,
                           "gaps": [[g.start, None if math.isinf(g.end) else g.end, g.cause]
                                    for g in life.gaps]} for life in self.lives],
            "store_gaps": [[g.start, g.end, g.cause] for g in self.store_gaps],
            "jobs": [{"prompt": job.prompt, "job_ids": sorted(job.job_ids),
                      "attempts": [vars(a) for a in job.attempts],
                      "cancels": [vars(a) for a in job.cancels]} for job in self.jobs],
        }
        with contextlib.suppress(OSError):
            (self.workdir / "timeline.json").write_text(json.dumps(data, indent=1))

    # -- the audit -----------------------------------------------------------------------
    # One pass that reads every job's whole story once; its checks share that state (C901).
    async def attempt_dirs_left(self, by_id: Mapping[str, Any]) -> list[Path]:
        """Attempt dirs of terminal jobs still in the spool once their removers had time:
        whoever wrote the terminal row (the owner, an adopter, a finalizer) removes the dir
        just after the write, so a dir seen at the row's end may be on its way out. Waits
        on that condition, up to ATTEMPT_DIR_GRACE_S; what is still there then is left."""
        def left() -> list[Path]:
            found: list[Path] = []
            for job_dir in sorted(spool_root(self.gateway_state_dir()).glob("*")):
                if job_dir.name in by_id and by_id[job_dir.name].status.is_terminal:
                    with contextlib.suppress(OSError):  # removed while we looked
                        found.extend(job_dir.iterdir())
            return found

        deadline = time.monotonic() + ATTEMPT_DIR_GRACE_S
        while (found := left()) and time.monotonic() < deadline:
            await anyio.sleep(0.2)
        return found

    async def audit(self, settings: Settings, leftovers: list[Spawn]) -> ChaosReport:  # noqa: C901
        bounds = Bounds.of(settings)
        store = await open_store(settings)
        try:
            rows = await store.list_jobs(limit=1_000_000)
            # A supervisor whose gateway died starts a finalizer (#22): its instance row
            # (role "finalizer") may be the owner that wrote a terminal row.
            finalizers = {i.instance_id for i in await store.list_instances()
                          if i.role == FINALIZER_ROLE}
            # The answer as a client reads it (llm_job_result): it may be stored as a range
            # of the output rather than as result_json's text.
            answers: dict[str, str] = {}
            for row in rows:
                if row.status == JobStatus.COMPLETED:
                    page = await store.read_output(row.id, 0, ANSWER_READ_BYTES, answer=True)
                    answers[row.id] = page[0].decode("utf-8", "replace") if page else ""
            escapes: list[str] = []
            if self.tamper is not None:
                escapes, self.tamper_info = await self.tamper.audit(settings, store, rows)
        finally:
            await store.close()
        report = ChaosReport(backend=self.o.backend,
                             require_finished=self.o.on_shutdown == "detach")
        if self.tamper is not None:
            report.escapes = len(escapes)
            report.details.extend(escapes)
        by_id = {r.id: r for r in rows}
        by_prompt: dict[str, list[JobRow]] = defaultdict(list)
        for row in rows:
            by_prompt[row_prompt(row) or ""].append(row)
        jobs_by_prompt = {job.prompt: job for job in self.jobs}
        lives_by_id = {life.instance_id: life for life in self.lives if life.instance_id}
        spawns_by_prompt: dict[str, list[Spawn]] = defaultdict(list)
        for spawn in self.spawns():
            spawns_by_prompt[spawn.prompt].append(spawn)
        intervals = {
            life.instance_id: unimpaired_intervals(life.ready_at, [*life.gaps, *self.store_gaps])
            for life in self.lives if life.instance_id}
        reapers = list(intervals.values())

        statuses = Counter(str(r.status) for r in rows)
        report.jobs = len(rows)
        report.completed = statuses["completed"]
        report.cancelled = statuses["cancelled"]
        report.orphaned = statuses["orphaned"]

        t0 = self.t0

        def timeline(row: JobRow) -> str:
            """One job's story, times in seconds since the chaos started."""
            life = lives_by_id.get(row.owner_instance or "")
            spawned = [f"pid {s.pid} at {rel(s.t, t0)}"
                       for s in spawns_by_prompt.get(row_prompt(row) or "", [])]
            owner = life.describe(t0) if life else row.owner_instance
            return (f"job {row.id} prompt={row_prompt(row)!r} status={row.status} "
                    f"error_kind={row.error_kind} created={rel(epoch(row.created_at), t0)} "
                    f"started={rel(epoch(row.started_at), t0)} "
                    f"finished={rel(epoch(row.finished_at), t0)} pid={row.pid} "
                    f"owner=[{owner}] spawns={spawned}")

        # lost
        missing = sorted({jid for job in self.jobs for jid in job.job_ids if jid not in by_id})
        active_now = {r.id for r in rows if r.status.is_active}
        lost = (self.active_after_settle | active_now) - set(missing)
        report.lost = len(lost) + len(missing)
        for job_id in sorted(lost):
            report.details.append(f"LOST (active after settle): {timeline(by_id[job_id])}")
        for job_id in missing:
            report.details.append(f"LOST (answered job id has no row): {job_id}")

        # unfinished: neither cancelled nor completed
        unfinished = [r for r in rows if r.status.is_terminal
                      and r.status not in (JobStatus.COMPLETED, JobStatus.CANCELLED)]
        report.unfinished = len(unfinished)
        for row in unfinished:
            report.details.append(f"UNFINISHED: {timeline(row)}")

        # unknown rows and owners
        unknown = [r for r in rows if (row_prompt(r) or "") not in jobs_by_prompt]
        for row in unknown:
            report.details.append(f"UNKNOWN ROW (no prompt the driver sent): {timeline(row)}")
        finalized = [r for r in rows if r.owner_instance in finalizers]
        unmapped = [r for r in rows
                    if r.owner_instance not in lives_by_id and r.owner_instance not in finalizers]
        for row in unmapped:
            report.details.append(f"UNKNOWN OWNER: {timeline(row)}")

        # false orphans: every orphaning, kept or later self-healed
        events = parse_orphan_events(life.log_path for life in self.lives)
        # (job, time, source, owner then): every logged orphaning, and a final `orphaned`
        # row whose orphaning was not logged (the row's own owner and finished_at; an
        # orphaning does not change the owner). A logged one is judged by its line's time,
        # a few ms after its UPDATE, with the owner its UPDATE returned.
        orphan_times: list[tuple[str, float, str, str | None]] = [
            (job_id, t, f"log of {reaper}", owner_then)
            for job_id, found in events.items() for t, reaper, owner_then in found]
        for row in rows:
            if (row.status == JobStatus.ORPHANED and row.finished_at is not None
                    and not events.get(row.id)):
                orphan_times.append((row.id, epoch(row.finished_at) or 0.0, "row, not logged",
                                     row.owner_instance))
        self_healed = len({job_id for job_id in events
                           if job_id in by_id and by_id[job_id].status != JobStatus.ORPHANED})
        # flaps: a terminal status seen (by the observer, or logged as orphaned) that the
        # final row no longer has. All instances share one host: no self-heal is allowed.
        flaps = dict(self.observed_flaps)
        for job_id, (first, seen_at) in self.seen_terminal.items():
            final = by_id.get(job_id)
            if final is not None and str(final.status) != first:
                flaps.setdefault(job_id, f"{first}@{rel(seen_at, t0)} -> {final.status} (final)")
        for job_id in events:
            final = by_id.get(job_id)
            if final is not None and final.status != JobStatus.ORPHANED:
                flaps.setdefault(job_id, f"orphaned (logged) -> {final.status} (final)")
        report.flapped = len(flaps)
        for job_id, story in sorted(flaps.items()):
            report.details.append(f"FLAPPED {story}: {timeline(by_id[job_id])}")
        unmapped_orphanings: list[str] = []
        orphan_margins: list[tuple[float, str]] = []  # (after its lease could lapse, job)
        for job_id, t, source, owner_then in sorted(orphan_times):
            found = by_id.get(job_id)
            if found is None:
                continue
            row = found
            # Judged against the owner it had when it was orphaned (adoption and re-queue
            # move a row to another instance later).
            owner_id = owner_then or row.owner_instance
            if owner_id not in intervals:
                # Not judged, so not silently passed either: an orphaning whose owner
                # then is no instance the driver started is a row it cannot explain.
                unmapped_orphanings.append(job_id)
                report.details.append(f"UNKNOWN OWNER AT ORPHANING ({owner_id}): "
                                      f"{timeline(row)}")
                continue
            created = epoch(row.created_at) or 0.0
            started = epoch(row.started_at)
            if started is not None and started > t and row.requeued_at is not None:
                started = None  # orphaned while queued, started only once re-queued
            owner_intervals = intervals[owner_id]
            orphan_margins.append((
                t - lease_valid_until(created, started, t, owner_intervals, bounds), job_id))
            if is_false_orphan(created, started, t, owner_intervals, bounds):
                report.false_orphans += 1
                valid = lease_valid_until(created, started, t, owner_intervals, bounds)
                owner = lives_by_id[owner_id]
                silence = longest_silence(log_times(owner.log_path), t - 2 * bounds.ttl_s, t)
                report.details.append(
                    f"FALSE ORPHAN at {rel(t, t0)} ({source}); lease provably valid until "
                    f"{rel(valid, t0)}; owner's longest log silence in the 2 ttl before: "
                    f"{silence:.2f} s (a stalled owner, e.g. CPU starvation, looks like "
                    f"this): {timeline(row)}")

        # late orphans: jobs of owners that died for good
        dead_owner_jobs = 0
        late_margins: list[tuple[float, str]] = []  # (before its deadline, job)
        for row in rows:
            life = lives_by_id.get(row.owner_instance or "")
            if life is None or life.final or life.death is None or life.exited_at is None:
                continue
            finished = epoch(row.finished_at)
            if finished is not None and finished <= life.death.start:
                continue  # done before its owner went away
            dead_owner_jobs += 1
            prompt = row_prompt(row) or ""
            # A reaper waits only for a process it can prove alive: one whose pid is on the
            # row. (Its spawn-log line may come after the owner died: no time filter.)
            process_exit = None
            candidates = [s for s in spawns_by_prompt.get(prompt, [])
                          if row.pid is not None and s.pid == row.pid]
            if candidates:  # seen ending at most WATCH_S after it did; never seen: still runs
                process_exit = max(s.ended or math.inf for s in candidates)
            deadline = orphan_deadline(life.exited_at, process_exit, reapers, self.stops, bounds)
            if finished is not None:
                late_margins.append((deadline - finished, row.id))
            if finished is None or finished > deadline:
                report.late_orphans += 1
                report.details.append(
                    f"LATE ORPHAN: owner gone at {rel(life.exited_at, t0)}, process exit by "
                    f"{rel(process_exit, t0)}, deadline {rel(deadline, t0)}, finished "
                    f"{rel(finished, t0)}: {timeline(row)}")

        # duplicate runs
        for prompt, spawned in spawns_by_prompt.items():
            ran = sum(1 for r in by_prompt.get(prompt, []) if r.started_at is not None)
            extra = excess_spawns(len(spawned), ran)
            if extra:
                report.duplicate_runs += extra
                rows_text = "; ".join(timeline(r) for r in by_prompt.get(prompt, [])) or "no row"
                report.details.append(
                    f"DUPLICATE RUN: {len(spawned)} spawns, {ran} rows that ran, prompt "
                    f"{prompt!r}: {rows_text}")

        # leftovers
        report.leftover_processes = len(leftovers)
        temp_cwds = sorted(self.tmp_dir.glob(f"{TEMP_DIR_PREFIX}*"))
        report.leftover_temp_cwds = len(temp_cwds)
        report.details.extend(f"LEFTOVER TEMP CWD {path}" for path in temp_cwds)
        attempts = await self.attempt_dirs_left(by_id)
        report.leftover_attempt_dirs = len(attempts)
        report.details.extend(f"LEFTOVER ATTEMPT DIR {path}" for path in attempts)
        for spawn in leftovers:
            report.details.append(f"LEFTOVER PROCESS pid {spawn.pid} prompt {spawn.prompt!r}")
        stuck = [life for life in self.lives if life.stuck]
        for life in stuck:
            report.details.append(
                f"STUCK GATEWAY (needed SIGKILL after SIGTERM): {life.describe(t0)}")

        # results of completed jobs carry their own prompt's answer
        bad_results = 0
        for row in rows:
            if row.status != JobStatus.COMPLETED:
                continue
            text = answers.get(row.id, "")
            if (row_prompt(row) or "\0") not in text:
                bad_results += 1
                report.details.append(f"BAD RESULT {text[:200]!r}: {timeline(row)}")

        submits = [a for job in self.jobs for a in job.attempts]
        confirmed = [job for job in self.jobs if job.job_ids]
        unconfirmed = [job for job in self.jobs if not job.job_ids]
        taken_over = count_log_events((life.log_path for life in self.lives),
                                      ("job adopted", "job re-queued: its owner left it unstarted",
                                       "detached"), summed={"detached": "runs"})
        report.info = {
            "on_shutdown": self.o.on_shutdown,
            "prompts": len(self.jobs),
            "confirmed": len(confirmed),
            "unconfirmed_with_row": sum(1 for j in unconfirmed if by_prompt.get(j.prompt)),
            "unconfirmed_without_row": sum(1 for j in unconfirmed if not by_prompt.get(j.prompt)),
            "submits": len(submits),
            "answer_lost": sum(1 for a in submits if a.outcome.startswith("lost")),
            "impatient_gave_up": sum(1 for a in submits if a.outcome == "lost:impatient"),
            "answer_lost_by": "/".join(f"{k}:{v}" for k, v in Counter(
                a.outcome.removeprefix("lost:") for a in submits
                if a.outcome.startswith("lost")).most_common()) or "-",
            "refused": sum(1 for a in submits if a.outcome.startswith("refused")),
            "deduplicated_answers": sum(1 for a in submits if a.deduplicated),
            "cancel_calls": sum(len(j.cancels) for j in self.jobs),
            "failed": statuses["failed"],
            "timed_out": statuses["timed_out"],
            "orphan_events": len(orphan_times),
            "dead_owner_jobs": dead_owner_jobs,
            # The tightest cases: an orphaning soonest after its lease could have lapsed,
            # and a dead owner's job closest to its deadline (negative = a violation).
            "min_orphan_after_lapse_s": tightest(orphan_margins),
            "min_slack_before_deadline_s": tightest(late_margins),
            "self_healed": self_healed,
            "adopted": taken_over["job adopted"],
            "requeued": taken_over["job re-queued: its owner left it unstarted"],
            "detaches": taken_over["detached"],
            # Runs a detaching gateway left running: each then ends under a peer that adopts
            # it, or under the finalizer its supervisor starts when no gateway is left (#22).
            "detached_runs": taken_over["detached.runs"],
            "finalized": len(finalized),
            "instances_started": len(self.lives),
            "sessions_per_instance": self.o.sessions_per_instance,
            "sessions_answering": len(self.session_answers),
            "sessions_opened": self.sessions_opened,
            "fresh_clients": self.fresh_clients,
            **{f"{k}s": v for k, v in sorted(self.actions.items())},
            "store_gaps": len(self.store_gaps),
            "stuck_gateways": len(stuck),
            "bad_results": bad_results,
            "unknown_rows": len(unknown) + len(unmapped) + len(unmapped_orphanings),
        }
        self.dump_timeline()
        if not report.ok:
            report.details.append("instances:")
            report.details.extend(f"  {life.describe(t0)}" for life in self.lives)
            report.details.append("store gaps: " + ", ".join(
                f"{g.cause} {rel(g.start, t0)}..{rel(g.end, t0)}" for g in self.store_gaps))
            report.details.append(f"chaos started at {t0:.3f} (epoch s)")
            report.details.extend(self.harness_notes)
            report.details.append(f"workdir: {self.workdir}")
        return report


async def run_chaos(options: ChaosOptions) -> ChaosReport:
    """Run the whole scenario and audit it. Never leaves a process behind."""
    run = ChaosRun(options)
    try:
        return await run.execute()
    finally:
        run.cleanup()


# -- CLI -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--instances", type=int, default=DEFAULT_INSTANCES)
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S,
                        help="seconds of chaos (submissions and actions)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--outage", type=float, default=3.0,
                        help="seconds the PostgreSQL server stays down (postgres only)")
    parser.add_argument("--impatient", type=float, default=0.0,
                        help="fraction of requests whose first try gives up within ~60 ms")
    parser.add_argument("--on-shutdown", choices=ON_SHUTDOWN_MODES, default="detach",
                        help="the gateways' [lease] on_shutdown (stop: drains, PG outage)")
    parser.add_argument("--kill-once-at", type=float, default=None,
                        help="the load scenario: no random chaos, one SIGKILL of one instance "
                             "at this share of --duration (e.g. 0.5)")
    parser.add_argument("--sessions-per-instance", type=int, default=1,
                        help="long-lived MCP sessions the driver holds with each instance")
    parser.add_argument("--fresh-clients", type=float, default=FRESH_SESSION_FRACTION,
                        help="share of calls made by a brand-new client (0: only the "
                             "long-lived sessions)")
    parser.add_argument("--tamper-worktrees", type=int, default=0,
                        help="jobs that run isolated and tamper with their worktree (#38)")
    parser.add_argument("--notify", action="store_true",
                        help="completion notices to a loopback webhook and a command sink")
    parser.add_argument("--webhook-outage", type=float, default=0.0,
                        help="with --notify: seconds the webhook is down (from a fifth into "
                             "the window), with the default retry schedule")
    parser.add_argument("--no-actions", action="store_true",
                        help="no kills, stops or outages of gateways or the store")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, db)")
    args = parser.parse_args(argv)

    import logging

    import structlog

    logging.basicConfig(level=logging.CRITICAL)  # the MCP client logs harmless cancel noise
    # The audit opens the store in this process: its logs go to stderr, warnings only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    workdir = Path(tempfile.mkdtemp(prefix="acg-chaos-"))
    server = None
    dsn = None
    if args.backend == "postgres":
        from tests.conftest import _start_or_give_up

        server = _start_or_give_up()
        server.create_database("chaos")
        dsn = server.dsn_for("chaos")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    options = ChaosOptions(backend=args.backend, workdir=workdir, jobs=args.jobs,
                           instances=args.instances, duration_s=args.duration, seed=seed,
                           dsn=dsn, store_control=server, outage_s=args.outage,
                           impatient_fraction=args.impatient, on_shutdown=args.on_shutdown,
                           kill_once_at=args.kill_once_at,
                           sessions_per_instance=args.sessions_per_instance,
                           fresh_session_fraction=args.fresh_clients,
                           tamper_worktrees=args.tamper_worktrees, notify=args.notify,
                           webhook_outage_s=args.webhook_outage,
                           actions=not args.no_actions)
    ok = False
    try:
        report = anyio.run(run_chaos, options)
        print(report.text())
        print(f"chaos-seed: {seed}")
        ok = report.ok
        (workdir / "report.txt").write_text(report.text() + "\n")
    finally:
        if server is not None:
            server.destroy()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"chaos-workdir: {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
