"""The job as every layer sees it: statuses, error kinds and the row of the `jobs` table.

Column names are the table contract (docs/architecture.md, The tables); both store backends use them verbatim.
"""

from __future__ import annotations

import codecs
from collections.abc import Generator
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from providers.figures import MAX_JOB_COST_USD

OUTPUT_CHUNK_BYTES = 256 * 1024  # one piece of a large output on its way into the row


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    ORPHANED = "orphaned"

    @property
    def is_active(self) -> bool:
        return self in ACTIVE_STATUSES

    @property
    def is_terminal(self) -> bool:
        return self not in ACTIVE_STATUSES


ACTIVE_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})
# What a finished run may be written as (orphaned is the reaper's, never a run's outcome).
FINAL_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.TIMED_OUT}
)


# The `error` text every backend writes with the two statuses only a store decides.
ORPHANED_ERROR = "owning gateway instance stopped renewing its lease"
CANCELLED_ERROR = "cancelled at the caller's request"


class ErrorKind(StrEnum):
    """What a caller can branch on (docs/tools.md, Errors)."""

    NOT_FOUND = "not_found"  # CLI missing (127)
    LAUNCH_FAILED = "launch_failed"  # 126
    OUTPUT_LIMIT = "output_limit"  # 126
    TIMEOUT = "timeout"  # wall clock, 124
    IDLE_TIMEOUT = "idle_timeout"  # 125
    QUEUE_TIMEOUT = "queue_timeout"  # 75
    SATURATED = "saturated"  # retryable
    INVALID_INPUT = "invalid_input"
    AUTH = "auth"
    PROVIDER_ERROR = "provider_error"  # non-zero exit
    SHUTDOWN = "shutdown"
    ORPHANED = "orphaned"
    UNAVAILABLE = "unavailable"  # durable admission off; retryable
    CANCELLED = "cancelled"
    JOB_NOT_FOUND = "job_not_found"  # unknown job id asked of llm_job_*
    LEGACY_JOB = "legacy_job"  # a job with no principal (0.1.0's) asked over HTTP with a token
    SETUP_ERROR = "setup_error"  # invalid config or a store that can never open: fix, restart
    WORKTREE_ERROR = "worktree_error"  # an isolated job's worktree could not be made (#27)
    BUDGET_EXCEEDED = "budget_exceeded"  # a [budgets] limit would be passed; not retryable
    REQUEUE_LIMIT = "requeue_limit"  # lost its owner more than lease.max_requeues in an hour
    NO_WORKER = "no_worker"  # runs_on: no live host could take it within queue_timeout_s
    INTERNAL_ERROR = "internal_error"  # a tool body crashed: a gateway bug, never a job's end

    @classmethod
    def of(cls, value: str) -> ErrorKind | None:
        """The member whose value this is, or None: a row's error_kind may come from a newer
        gateway that shares the store and knows kinds this one does not."""
        try:
            return cls(value)
        except ValueError:
            return None


EXIT_CODES: dict[ErrorKind, int] = {
    ErrorKind.NOT_FOUND: 127,
    ErrorKind.LAUNCH_FAILED: 126,
    ErrorKind.OUTPUT_LIMIT: 126,
    ErrorKind.TIMEOUT: 124,
    ErrorKind.IDLE_TIMEOUT: 125,
    ErrorKind.QUEUE_TIMEOUT: 75,
}

RETRYABLE = frozenset({ErrorKind.SATURATED, ErrorKind.UNAVAILABLE, ErrorKind.QUEUE_TIMEOUT})


class GatewayError(Exception):
    """An error with a kind the caller can branch on and a message that says what to do."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


@dataclass(slots=True)
class JobRow:
    """One row of the `jobs` table. Times are timezone-aware UTC datetimes."""

    id: str
    provider: str
    status: JobStatus
    request_key: str
    transport: str = "process"  # "process" | "http"
    correlation_id: str | None = None
    owner_instance: str | None = None
    lease_deadline: datetime | None = None
    hostname: str | None = None
    pid: int | None = None
    pgid: int | None = None
    pid_started_at: float | None = None  # process start time, seconds since the epoch
    working_dir: str | None = None
    model: str | None = None
    session_id: str | None = None
    request_json: str = "{}"
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    exit_code: int | None = None
    error: str | None = None
    error_kind: str | None = None
    output: str | None = None
    stderr_tail: str | None = None
    output_bytes: int = 0
    truncated: bool = False
    result_json: str | None = None
    cancel_requested_at: datetime | None = None
    forced: bool = False
    boot_id: str | None = None
    # When a gateway queued it again after its first owner left it unstarted (at most once).
    requeued_at: datetime | None = None
    # How often it was queued again uncharged (its owner proven gone before it started), and
    # why each time (a JSON array of {"at", "reason"}): lease.max_requeues bounds the first.
    requeue_count: int = 0
    requeue_reasons: str | None = None
    # The hostname of the gateway that orphaned it: an orphaning by a gateway of the job's
    # own host is final; one from another host may be self-healed by its revived owner.
    orphaned_by: str | None = None
    # Who made it (gateway/mcp/principal.py): "local", or a hash of the bearer token. NULL on
    # a row from before schema 4.
    principal: str | None = None
    # Where it may run (schema 11, worker hosts): NULL is "here" (its admitting gateway's
    # host); else JSON: "any", {"host": ...} or {"labels": {...}}: a worker claims it.
    runs_on: str | None = None
    # When a worker claimed it (NULL: not claimed; cleared by a re-queue to the pool).
    claimed_at: datetime | None = None
    # Why no live host can take it now (NULL: one can, or it is not a remote job).
    unschedulable_reason: str | None = None
    # When a gateway last adopted it (schema 15; NULL: never adopted). The adopter is its
    # owner_instance until a later re-queue or claim moves the job on.
    adopted_at: datetime | None = None

    @classmethod
    def column_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, row: Any) -> JobRow:
        """The row from a mapping of column values (a dict, sqlite3.Row, asyncpg Record).
        A narrow read (some columns only, e.g. the reaper's) leaves the rest at defaults."""
        present = set(row.keys())
        data = {name: row[name] for name in cls.column_names() if name in present}
        data["status"] = JobStatus(data["status"])
        for flag in ("truncated", "forced"):
            if flag in data:
                data[flag] = bool(data[flag])
        for count in ("output_bytes", "requeue_count"):
            if count in data:
                data[count] = int(data[count] or 0)
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What admitting one job holds of one budget (issue 28): `amount` (micro-USD, or 1 for a
    job-count budget) of the current UTC `period` window, never past `limit`."""

    budget: str  # the limit's config path: "daily_usd", "providers.claude.max_jobs_per_day"
    period: str  # "day" | "month"
    unit: str  # "usd" (micro-dollars) | "jobs"
    amount: int
    limit: int


@dataclass(slots=True)
class NewJob:
    """What admission inserts. The store stamps created_at/updated_at and lease_deadline."""

    id: str
    provider: str
    request_key: str
    owner_instance: str
    transport: str = "process"
    correlation_id: str | None = None
    hostname: str | None = None
    boot_id: str | None = None
    working_dir: str | None = None
    model: str | None = None
    session_id: str | None = None
    request_json: str = "{}"
    forced: bool = False
    # Held in the insert's own transaction, in this order (budgets.py sorts them): the job
    # is admitted with all of them or not at all (BudgetExceeded).
    reservations: tuple[Reservation, ...] = ()
    principal: str | None = None
    # Inserted `running` (started_at stamped): a process job admitted into a free run slot,
    # its attempt dir made before the insert as it is before the launch's CAS otherwise.
    running: bool = False
    # runs_on other than "here", as stored (JobRow.runs_on); PostgreSQL only.
    runs_on: str | None = None


class OutputFileError(RuntimeError):
    """An OutputFile could not be read back as it was measured (removed or changed)."""


@dataclass(frozen=True, slots=True)
class OutputFile:
    """A run's final stdout as valid UTF-8 in a file (its spool file, or a cleaned copy).

    A store writes it into `output` piece by piece (`chunks`), so an output of
    limits.max_output_bytes is never held whole in the gateway; one of at most
    OUTPUT_CHUNK_BYTES it may read in one piece (`text`). The file must not change
    until the terminal write is done.
    """

    path: Path
    size: int  # bytes

    @property
    def small(self) -> bool:
        """Small enough to bind as one value (a single piece)."""
        return self.size <= OUTPUT_CHUNK_BYTES

    def chunks(self) -> Generator[bytes, None, None]:
        """Exactly `size` bytes, in pieces of OUTPUT_CHUNK_BYTES (a piece may end inside a
        character: `text_chunks` decodes across the cut).

        Raises OutputFileError when the file is gone or shorter than measured.
        """
        if self.size == 0:
            return  # nothing to read, whether or not a file is there
        try:
            with self.path.open("rb") as fh:
                remaining = self.size
                while remaining > 0:
                    data = fh.read(min(OUTPUT_CHUNK_BYTES, remaining))
                    if not data:
                        raise OutputFileError(f"{self.path} ended {remaining} bytes early")
                    remaining -= len(data)
                    yield data
        except OSError as exc:
            raise OutputFileError(f"cannot read the output file {self.path}: {exc}") from exc

    def text_chunks(self) -> Generator[str, None, None]:
        """The output as text, piece by piece (a generator: close it to release the file
        early)."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for chunk in self.chunks():
            if text := decoder.decode(chunk):
                yield text
        if tail := decoder.decode(b"", final=True):
            yield tail

    def text(self) -> str:
        """The whole output as text: only for a small one, or a store that holds it anyway."""
        return "".join(self.text_chunks())


MICRO_USD = 1_000_000  # money is summed in whole micro-dollars: sums of cents stay exact


def to_micro_usd(usd: float) -> int:
    return round(usd * MICRO_USD)


def from_micro_usd(micro: int) -> float:
    return round(micro / MICRO_USD, 6)


@dataclass(frozen=True, slots=True)
class UsageFigures:
    """What a terminal write adds to the usage totals (issue 28): the figures reported (None:
    not reported, never 0), where the cost came from, and the model to group it under
    (None: the job's own `model` column)."""

    cost_source: str  # "reported" | "estimated" | "absent" | "invalid" (providers/usage.py)
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None

    @property
    def cost_micro_usd(self) -> int | None:
        """The cost in whole micro-dollars, as the totals and budgets add it. Never negative
        and never raising: the check where the figure was parsed (providers/figures.py)
        refuses such a cost, and one that got past it anyway is left out here rather than
        credited to a budget or failing the job's terminal write (#38)."""
        cost = self.cost_usd
        if cost is None or not 0 <= cost <= MAX_JOB_COST_USD:  # False for NaN too
            return None
        return to_micro_usd(cost)


@dataclass(slots=True)
class Completion:
    """The terminal write of a run (guarded complete)."""

    status: JobStatus  # one of FINAL_STATUSES
    exit_code: int | None = None
    error: str | None = None
    error_kind: str | None = None
    output: str | OutputFile | None = None  # a large one is written in pieces
    stderr_tail: str | None = None
    output_bytes: int = 0
    truncated: bool = False
    result_json: str | None = None
    # Added to the usage totals with the write (None: a job that reported no usage; it is
    # still counted, apart) and settles the job's budget reservations (gateway/jobs/budgets.py).
    usage: UsageFigures | None = None
    # When the run really ended (epoch s, the supervisor's end record): the row's finished_at,
    # never the time a later gateway finalized it (never later than the store's now).
    ended_at: float | None = None


@dataclass(slots=True)
class InstanceRow:
    instance_id: str
    hostname: str
    boot_id: str
    pid: int
    pid_started_at: float | None
    role: str  # "stdio" | "http" | "cli"
    version: str
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    lease_expires_at: datetime | None = None
    stopped_at: datetime | None = None
    # The worst lease renewal wait of the last hour (ms), as its last heartbeat wrote it
    # (None: not measured yet, or a gateway before schema 7).
    renewal_wait_ms_max_1h: float | None = None
    # What it can run, as JSON (a worker's: providers found and logged in, os, platform,
    # hostname, labels, repos, accept_remote; schema 11). None: a gateway that publishes none.
    capabilities: str | None = None


@dataclass(slots=True)
class Progress:
    """Partial output of a running job, flushed every few seconds for other readers."""

    output_bytes: int  # stdout bytes so far
    output: str  # the last part of stdout so far (bounded by the caller), into `output`
    stderr_tail: str = ""
