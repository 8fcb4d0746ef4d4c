"""The JobStore protocol, by role: the persistence every backend implements (docs/architecture.md).

The store is a dumb executor of named statements; the manager and the lease tasks own the
meaning. Every state transition is a compare-and-set whose WHERE clause is the invariant, so
two instances racing on one row can never both win. Backends: `memory/`, `sqlite/`,
`postgres/` (a folder each); all pass the contract suite, `tests/store/test_contract_*.py`.

Clocks: PostgreSQL compares times with the database clock `now()`; SQLite and memory use the
local clock. Durations are passed in seconds. A `clock_skew_s` hook is never needed: callers
never pass a wall-clock time to compare against (only durations).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol, runtime_checkable

from gateway.model import (
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
    OutputFile,
    Progress,
)
from gateway.store.protocol_roles import AttemptGroups, NoticeOutbox, WorkerQueue
from gateway.store.usage import BudgetWindow, GroupBy, UsageRow

# 2: SQLite keeps `output` last in the row; 3: `requeued_at`; 4: `principal` (who made the
# job: only they see it over MCP); 5: usage totals and budgets (store/usage.py);
# 6: `requeue_count`, `requeue_reasons`, `orphaned_by`; 7: `schema_meta` (the lowest gateway
# version that may write the store: store/compat.py) and the instances' renewal wait; 8:
# `sweeps` (one sweeper per interval) and, on PostgreSQL, fillfactor and the jobs_notify trigger.
# 11: worker hosts: `jobs.runs_on`, `claimed_at`, `unschedulable_reason` and
# `gateway_instances.capabilities`;
# 12: `attempt_groups` and `attempts` (best-of-N, issue 39: store/attempts.py);
# 13: `completion_notices` (the outbox of issue 40: store/outbox.py);
# 14: `remote_patches`: what a worker ran of a worktree job, and removal requests;
# 15: `jobs.adopted_at` (when a gateway last adopted the job: the dashboard's timeline).
SCHEMA_VERSION = 15

# The reaper reads at most this many candidates per sweep (oldest lease first; the rest are
# read by the next sweep): a sweep's cost is bounded whatever happened to the table.
REAPER_BATCH_ROWS = 500
# What the reaper reads of a candidate and of a row it flipped: enough to probe the process
# (host, boot, pid and its start time) and to log it; never the request or the output.
REAPER_COLUMNS = (
    "id", "provider", "status", "request_key", "transport", "owner_instance",
    "lease_deadline", "hostname", "boot_id", "pid", "pgid", "pid_started_at",
    "error", "error_kind", "finished_at", "updated_at",
)

# "Active" as SQL, `('queued','running')`, in JobStatus order: how every statement of both
# dialects says it (`status IN {ACTIVE_STATUSES_SQL}`: the partial unique index of dedup and
# the upsert that names it, the reaper, cancel, adoption, the reservation sweeper). Derived
# from the model, so no statement can go on naming a list the model has left; both dialects
# spell a list of string literals alike, so one fragment serves both.
ACTIVE_STATUSES_SQL = "(" + ",".join(f"'{status.value}'" for status in JobStatus
                                     if status.is_active) + ")"

# What an admission's INSERT writes, in the order both dialects' VALUES lists follow.
NEW_JOB_COLUMNS = (
    "id", "provider", "status", "request_key", "transport", "correlation_id",
    "owner_instance", "lease_deadline", "hostname", "working_dir", "model", "session_id",
    "request_json", "created_at", "updated_at", "forced", "boot_id", "principal", "started_at",
)


class StoreUnavailable(Exception):
    """The store cannot be reached or refused a statement (connection lost, disk full...).

    The message never contains a DSN password or any secret. `permanent` marks a cause that
    cannot pass by itself (a path that cannot be created, credentials refused, a schema
    newer than this gateway): retrying is pointless until someone fixes it, and a caller
    must be told so rather than "retry in a few seconds".
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class StoreFull(StoreUnavailable):
    """The store refused a write because its disk is full (SQLite: the state filesystem;
    PostgreSQL: the server's). Retrying the same write cannot succeed: the caller must write
    less (a completion keeps what fits of its output) or free space first."""


class StoreReplaced(StoreUnavailable):
    """The store's file was deleted or replaced while this gateway had it open (SQLite).

    Writes would land in the old, unlinked file and vanish, and another gateway would start
    over on an empty one: the store refuses every call from then on, and the gateway stops
    admitting until it is restarted. The message says what happened and what to do.
    """


class DuplicateActiveJob(Exception):
    """insert_job lost the race: a non-forced active job with the same request_key exists.

    `existing_id` names it so admission can answer with that job instead (exactly-once).
    """

    def __init__(self, existing_id: str | None) -> None:
        super().__init__(f"an active job with the same request key exists: {existing_id}")
        self.existing_id = existing_id


@dataclasses.dataclass(frozen=True, slots=True)
class TakeOver:
    """One compare-and-set that moves a job to this instance (adopt_job, requeue_job).

    `expected_owner` and `expected_status` are what the caller read: the write applies only
    if the row still says so, so of any number of instances racing exactly one wins.
    """

    job_id: str
    expected_owner: str | None
    expected_status: JobStatus
    instance_id: str
    hostname: str
    boot_id: str
    ttl_s: float
    # requeue_job only: the job's re-queue reasons after this one (a JSON array); the CAS
    # makes the caller's read the one the write applies to.
    requeue_reasons: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class JobsPage:
    """One page of the dashboard's jobs table (list_jobs_page): filters and a keyset cursor.

    `after_id` is the id of the last row of the previous page: the page goes on from there
    in the table's order (newest first) whatever was inserted since, and reads only its
    rows off the `created_at` index (an OFFSET would read every row before it).
    """

    statuses: tuple[JobStatus, ...] | None = None
    provider: str | None = None
    hostname: str | None = None
    after_id: str | None = None
    limit: int = 50


@dataclasses.dataclass(slots=True)
class AdoptionCandidate:
    """A job on this host whose owner may be gone, with what its owner row says."""

    job: JobRow  # a light row, without output and result_json
    owner: InstanceRow | None  # None: the owner's row was collected (it holds no lease)


def without_output(row: JobRow) -> JobRow:
    """A copy of `row` as a light read returns it: no output, and result_json (when it is a
    JSON object) without its `text`. For backends that build light rows in Python."""
    result_json = row.result_json
    if result_json is not None:
        try:
            parsed = json.loads(result_json)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "text" in parsed:
            del parsed["text"]
            result_json = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False)
    return dataclasses.replace(row, output=None, result_json=result_json)


def reaper_row(row: JobRow) -> JobRow:
    """A copy of `row` as the reaper's narrow reads return it: REAPER_COLUMNS only, the
    rest at their defaults. For backends that build rows in Python."""
    return JobRow.from_mapping({name: getattr(row, name) for name in REAPER_COLUMNS})


def answer_in(result_json: str | None) -> str | tuple[int, int] | None:
    """Where read_output(answer=True) finds the parsed answer: result_json's `text` when it
    is a non-empty string; or its `text_span` [start, end), the byte range of `output` that
    is the answer (how an answer that is the output, or a range of it, is stored: once);
    None when there is neither (then the output itself is paged)."""
    try:
        parsed = json.loads(result_json) if result_json else None
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    text = parsed.get("text")
    if isinstance(text, str) and text:
        return text
    span = parsed.get("text_span")
    if (isinstance(span, list) and len(span) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in span)
            and 0 <= span[0] < span[1]):
        return span[0], span[1]
    return None


def page_bounds(size: int, offset: int, length: int,
                span: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """read_output's page of a `size`-byte value (or of its range `span`): the first byte,
    how many bytes to read, and the paged size. Offsets past the end give an empty page."""
    start, end = span if span is not None else (0, size)
    end = min(end, size)
    start = min(start, end)
    first = start + min(max(offset, 0), end - start)
    return first, min(end - first, max(length, 0)), end - start


def page_of(data: bytes, offset: int, length: int,
            span: tuple[int, int] | None = None) -> tuple[bytes, int]:
    """read_output's page of `data` (or of its range `span`) and the paged size, in bytes."""
    first, count, total = page_bounds(len(data), offset, length, span)
    return data[first:first + count], total


# Rows one retention statement deletes at most: each batch is a short transaction of its own,
# so a backlog of a million rows never holds their locks (or a long transaction) at once.
RETENTION_BATCH_ROWS = 10_000
PREFIX_MATCH_LIMIT = 10  # ids shown for an ambiguous prefix: a few are enough to pick from


def like_prefix(prefix: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching the values that start with `prefix` literally:
    a `%` or `_` the operator typed is a character, not a wildcard."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def output_to_bind(output: str | OutputFile | None) -> tuple[str | None, OutputFile | None]:
    """(the output as one value to bind, or the file a store must write in pieces): a small
    OutputFile is read and bound like text; a large one is never read whole."""
    if isinstance(output, OutputFile):
        return (output.text(), None) if output.small else (None, output)
    return output, None


@runtime_checkable
class StoreMeta(Protocol):
    """The store itself: which backend, opening it (create or migrate the schema),
    closing it, its schema version and its clock."""

    backend: str  # "memory" | "sqlite" | "postgres"

    async def open(self) -> None:
        """Connect, create/migrate the schema (PostgreSQL: under an advisory lock)."""

    async def close(self) -> None: ...

    async def schema_version(self) -> int: ...

    async def now(self) -> float:
        """The store's clock (epoch seconds): the database clock on PostgreSQL."""


@runtime_checkable
class InstanceRows(Protocol):
    """The gateway instances' rows: registration, the heartbeat that is every owned
    job's lease, a clean stop, and the collection of rows whose owner is gone."""

    async def register_instance(self, instance: InstanceRow, ttl_s: float) -> None:
        """Upsert the instance row; heartbeat_at = now, lease_expires_at = now + ttl_s."""

    async def mark_instance_stopped(self, instance_id: str) -> None:
        """Clean shutdown: stopped_at = now (the row stays for GC and observability)."""

    async def heartbeat(self, instance_id: str, ttl_s: float,
                        renewal_wait_ms: float | None = None) -> int:
        """Renew the instance row: lease_expires_at = now + ttl_s. That lease covers every
        job the instance owns (see recover_expired_leases), so the heartbeat writes one row
        whatever the job count; job rows are not touched. `renewal_wait_ms` (the worst
        renewal wait of the last hour, when measured) is written with it, for `instances`.

        Returns the number of instance rows renewed (0 means the row is gone: re-register).
        """

    async def gc_instances(self, older_than_s: float, hostname: str | None = None,
                           keep: Sequence[str] = ()) -> int:
        """Delete instance rows stopped, or whose lease expired, more than older_than_s ago.

        With `hostname`, a row whose lease expired is deleted only if it is of that host and
        not in `keep` (the caller's host's rows whose pid is alive: a SIGSTOPped owner is
        not gone). A stopped row is deleted whatever its host: its owner said it left."""

    async def list_instances(self) -> list[InstanceRow]: ...


@runtime_checkable
class JobRows(Protocol):
    """The job rows: admission, the compare-and-set transitions, the reaper's reads and
    flips, retention, reads and pages of output, detach, adoption and re-queue."""

    # -- admission and transitions -----------------------------------------------------
    async def find_reusable(self, request_key: str, dedup_window_s: float) -> JobRow | None:
        """The job an identical request should reuse: non-forced, and queued/running (any
        age), or completed with finished_at within dedup_window_s. Newest first. Never
        failed, cancelled, timed_out or orphaned. A light row (as get_job with_output=False):
        admission answers with the job's id and status, never its output."""

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        """Insert a queued row, lease_deadline = now + ttl_s; a running one (started_at =
        now) when `job.running`: admitted into a free run slot, it needs no queued -> running
        CAS before its launch.

        Raises DuplicateActiveJob when a non-forced active row has the same request_key (a
        partial unique index enforces it, so two instances racing get exactly one job).
        In the same transaction holds `job.reservations` in their order, each one
        conditional write against spent + reserved + amount <= limit of its budget's current
        window; BudgetExceeded (store/usage.py) when one does not fit, and then nothing of
        the admission is written.
        """

    async def mark_running(self, job_id: str, owner_instance: str, ttl_s: float) -> bool:
        """CAS queued -> running for this owner; stamps started_at and renews the lease.
        False if the row is no longer queued (orphaned, cancelled).

        The manager marks a row running BEFORE it spawns, so a row orphaned or cancelled
        while queued never gets a child; the process identity follows (record_process)."""

    async def record_process(
        self, job_id: str, owner_instance: str, pid: int, pgid: int, pid_started_at: float
    ) -> bool:
        """Stamp pid/pgid/pid_started_at on a running row owned by owner_instance, once the
        child is spawned: the reaper's proof that the job's process is alive.

        False if the row is no longer running or no longer this instance's. The run goes
        on then: the owner's guarded terminal write self-heals a row orphaned meanwhile,
        and a row without a pid errs towards being orphaned, never towards being lost."""

    async def complete(self, job_id: str, owner_instance: str,
                       completion: Completion) -> JobRow | None:
        """Guarded terminal write: applies only if owner_instance owns the row and it is
        queued, running, or orphaned by a gateway of another host (self-heal); a job
        adopted or re-queued elsewhere is no longer its first owner's to end. A cancel
        request on the row makes the final status `cancelled` whatever the completion says
        (cancelled wins). Terminal rows never change. Returns the row as the write left it,
        light like get_job(with_output=False) (a sync caller answers from it without
        reading it again), or None when it did not apply.

        When it applies, the same transaction settles the job's budget reservations
        (reserved -> spent: the reported cost, a job-count budget its one job) and adds the
        job once to the usage totals (`completion.usage`; None counts it apart, as a job
        that reported no usage).

        The status and the whole output commit together: a reader sees the row active, or
        terminal with all of its output, never between. An OutputFile larger than one piece
        is written from the file in pieces, never held whole (OutputFileError if it cannot
        be read back)."""

    async def request_cancel(self, job_id: str) -> JobRow | None:
        """Set cancel_requested_at = now if the row is still active (first request wins; a
        second leaves the first time). Returns the row after the write, light (as get_job
        with_output=False), or None if unknown."""

    async def list_cancel_requested(self, owner_instance: str) -> list[str]:
        """Ids of this instance's queued/running jobs whose cancel was requested."""

    async def save_progress(self, job_id: str, owner_instance: str, progress: Progress) -> bool:
        """Write partial output of a running job (only while running and owned by owner)."""

    # -- the reaper --------------------------------------------------------------------
    async def list_expired_candidates(
        self, http_grace_s: float, limit: int = REAPER_BATCH_ROWS
    ) -> list[JobRow]:
        """Active jobs whose lease passed: both their own lease_deadline and their owner's
        lease_expires_at (an owner without a row holds none); http jobs get http_grace_s on
        top. Read-only: the reaper probes these for a provably live process first.

        At most `limit` rows, oldest lease first (the rest come next sweep), and narrow
        ones: only REAPER_COLUMNS are read (a request can be 1 MiB, an output tail 64 KiB;
        the reaper needs neither), the other fields keep their defaults."""

    async def recover_expired_leases(
        self, http_grace_s: float, job_ids: Collection[str], orphaned_by: str | None = None,
    ) -> list[JobRow]:
        """Orphan those of `job_ids` (the candidates the reaper listed and judged not
        provably alive) whose lease still passed, as list_expired_candidates judges it. Only
        those: a job that lapsed after the listing waits for the next sweep's probe. The
        predicate is re-checked inside the UPDATE (no select-then-flip), and no heartbeat
        of a judged owner can commit in between; PostgreSQL skips rows (and owners) another
        transaction holds locked, so one stalled peer cannot stall the sweep. Returns the
        rows it flipped, narrow (REAPER_COLUMNS and the orphaned outcome).

        `orphaned_by` is the reaper's hostname, stamped on the row: an orphaning on the
        job's own host is final (complete() refuses it), one from another host (or unknown)
        may be self-healed by its revived owner."""

    # -- retention and reads -----------------------------------------------------------
    async def purge_terminal(self, older_than_s: float,
                             limit: int = RETENTION_BATCH_ROWS) -> list[str]:
        """Delete terminal jobs finished more than older_than_s ago, at most `limit` of them
        (in no particular order); returns their ids (fewer than `limit`: none is left)."""

    async def get_job(self, job_id: str, *, with_output: bool = True) -> JobRow | None:
        """The row. with_output=False is the light read of status, wait, list and cancel:
        `output` is None and result_json lacks its `text` (the parsed answer): each can be
        max_output_bytes, and those reads need neither (read_output pages them)."""

    async def list_jobs(
        self, *, statuses: Sequence[JobStatus] | None = None, provider: str | None = None,
        owner_instance: str | None = None, principal: str | None = None,
        unowned_too: bool = False, limit: int = 50, with_output: bool = True,
    ) -> list[JobRow]:
        """Newest first. with_output=False: light rows, as get_job. `principal`: only the
        jobs it made, plus those with no principal (from before schema 4) if `unowned_too`;
        filtered before `limit`, so a page is full whenever that many rows exist (#23)."""

    async def list_jobs_page(self, page: JobsPage) -> list[JobRow]:
        """A page of light rows (as get_job with_output=False), newest first (created_at,
        then id, descending), filtered by status, provider and host before the limit;
        after `page.after_id`'s row when given (none when that job is gone: the caller
        starts over). The dashboard's jobs table: a page of a large table costs its rows."""

    async def find_job_ids(self, prefix: str, limit: int = PREFIX_MATCH_LIMIT) -> list[str]:
        """Ids of jobs that start with `prefix` (case-sensitive, literally: LIKE wildcards in
        it match only themselves), sorted, at most `limit`: how the CLI resolves a short id.
        An empty prefix matches nothing."""

    # -- detach, adoption, re-queue (docs/architecture.md) -----------------------------
    async def extend_leases(self, instance_id: str, seconds: Mapping[str, float]) -> int:
        """Detach: lease_deadline = now + seconds[id] for each of this instance's RUNNING
        jobs named (never shortened), so no gateway orphans a run its supervisor may still be
        running after its owner left. Returns how many rows were extended."""

    async def list_adoption_candidates(
        self, instance_id: str, hostname: str, boot_id: str, orphaned_within_s: float,
        limit: int,
    ) -> list[AdoptionCandidate]:
        """Active jobs on `hostname` owned by another instance that may be gone (an
        orphaned job is final: never a candidate; `orphaned_within_s` is unused); only those
        whose owner row is stopped, collected, or on this host and boot (the caller probes
        that owner's pid). A running http job is left out until its lease passed (its owner
        may be draining it). At most `limit`: those whose owner row is collected, stopped
        or lapsed first, then the oldest, so a busy host's live jobs never fill the batch
        ahead of a dead owner's (the reaper would otherwise orphan it unseen)."""

    async def adopt_job(self, take: TakeOver) -> JobRow | None:
        """CAS owner_instance -> take.instance_id on a queued, running or orphaned job of
        this host (a running one: of this boot too), as the caller read it. The status does
        not change (an orphaned row is healed by the adopter's guarded complete()). Returns
        the light row after the write, None if another instance won or the row changed."""

    async def requeue_job(self, take: TakeOver) -> JobRow | None:
        """CAS a job that never ran back to `queued` for this instance (requeued_at = now):
        no cancel request on it, and no active twin with its request key (dedup stays
        exactly-once). The caller has proved it never started (its row was queued, or its
        spool's start record was claimed for the re-queue), so it may be queued again each
        time an owner of it is proven gone; an HTTP call that started (it may have been
        billed) only once. Clears the start and the error fields. Returns the light row,
        None if it did not apply."""

    # -- output and its changes --------------------------------------------------------
    async def read_output(
        self, job_id: str, offset: int, length: int, *, answer: bool = False
    ) -> tuple[bytes, int] | None:
        """Up to `length` bytes of the job's output (UTF-8) from byte `offset`, and the
        output's total size in bytes, read in the store: a page never needs the whole
        output in the gateway's memory. answer=True pages the parsed answer instead (see
        answer_in: result_json's `text`, or the range of the output its `text_span` names),
        else the output. The cut is at bytes: the caller trims the page to whole
        characters. None: no such job."""

    async def wait_for_change(self, job_id: str, timeout_s: float) -> None:
        """Return when the store tells of a change to the job's status or cancel request
        (PostgreSQL over a direct connection: LISTEN/NOTIFY), else after timeout_s: a
        waiter on a job run by another instance re-reads the row then. A change may be
        missed (it came before the call): the timeout is the poll that catches it."""


@runtime_checkable
class UsageLedger(Protocol):
    """The usage ledger (issue 28; store/usage.py): totals per day, the budgets'
    windows, and the sweeper that releases reservations nobody settled. Admission's
    reservations and completion's settlement ride on JobRows' transactions."""

    async def usage_totals(self, group_by: GroupBy, since_day: str | None = None,
                           until_day: str | None = None) -> list[UsageRow]:
        """The usage totals of every job that ended from UTC day `since_day` through
        `until_day` (YYYY-MM-DD, inclusive; None: open), per group and cost source, read
        from the rollup (a few rows per day, never a scan of the jobs)."""

    async def budget_windows(self, budgets: Sequence[tuple[str, str]]) -> list[BudgetWindow]:
        """The current window (store clock, UTC) of each (budget, period), in the given
        order; a window nobody reserved in yet reads as zero."""

    async def release_reservations(self) -> int:
        """The sweeper: release the reservations of jobs that ended without settling them
        (orphaned by the reaper) or whose row is gone; each exactly once, whoever races.
        Returns how many were released."""


@runtime_checkable
class SweepClaims(Protocol):
    """One sweeper per interval (issue 29): the claim of a periodic task's run."""

    async def claim_sweep(self, task: str, every_s: float) -> bool:
        """Claim this interval's run of a periodic task (a host's reaper, retention): True
        for exactly one caller per `every_s` seconds on the store's clock, however many
        gateways race for it; the others skip their sweep at once (issue 29)."""

    async def sweep_runs(self, task: str) -> int:
        """How many runs of `task` were claimed so far (0 for a task never claimed)."""


@runtime_checkable
class JobStore(StoreMeta, InstanceRows, JobRows, UsageLedger, SweepClaims, WorkerQueue,
               AttemptGroups, NoticeOutbox, Protocol):
    """Async persistence of jobs and gateway instances: all the roles above, which every
    backend (memory/, sqlite/, postgres/) implements. The roles say which part of the store
    a rule belongs to, so a new capability lands in one of them, not in one protocol of
    thirty-odd methods; a caller that needs the store takes a JobStore. The contract suite
    (tests/store/test_contract_*.py) runs each role on every backend."""
