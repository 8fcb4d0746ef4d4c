"""Supervisor end record -> `RunOutcome`: what a run's end means (docs/architecture.md, Running a provider).

The next step, outcome -> the store's `Completion`, is gateway/jobs/outcome_to_completion.py.

One reading for every gateway that finalizes a run: the one that started it, and one that
adopted it after its owner died. The rules that decide how a run ends (timeouts, output cap,
stop escalation) live in the supervisor (`supervisor.py`); this module only says what its
record means for the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway import proc
from gateway.jobs.run import spool
from gateway.jobs.run import supervisor as sup
from gateway.model import EXIT_CODES, ErrorKind

ERROR_TAIL_BYTES = 4096  # how much of the end of stderr is read to quote a provider's error
ERROR_TAIL_LINES = 3  # how many last non-empty stderr lines become the error text

_WHY_KINDS = {
    sup.WHY_TIMEOUT: ErrorKind.TIMEOUT,
    sup.WHY_IDLE: ErrorKind.IDLE_TIMEOUT,
    sup.WHY_OUTPUT: ErrorKind.OUTPUT_LIMIT,
    sup.WHY_LAUNCH: ErrorKind.LAUNCH_FAILED,
    sup.WHY_NOT_FOUND: ErrorKind.NOT_FOUND,
}


@dataclass(slots=True)
class RunOutcome:
    exit_code: int | None  # the provider's own exit code, or the gateway's code (124...)
    error_kind: ErrorKind | None  # None on a clean exit 0
    error: str | None
    stdout_path: Path
    stderr_path: Path
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    duration_s: float
    signal: int | None = None  # set when the CLI died of a signal
    extra: dict[str, object] = field(default_factory=dict)
    ended_at: float | None = None  # epoch s, from the supervisor's end record


@dataclass(slots=True)
class Limits:
    """What the stop messages quote (the run's own spec)."""

    timeout_s: float
    idle_timeout_s: float | None
    max_output_bytes: int


def stop_message(kind: ErrorKind, limits: Limits) -> str:
    if kind == ErrorKind.TIMEOUT:
        return (f"The run exceeded its wall-clock timeout of {limits.timeout_s:g} s and was "
                "stopped; pass a larger timeout_s (default: limits.default_timeout_s).")
    if kind == ErrorKind.IDLE_TIMEOUT:
        return (f"The provider wrote no output for {limits.idle_timeout_s or 0:g} s and was "
                "stopped (limits.idle_timeout_s).")
    if kind == ErrorKind.OUTPUT_LIMIT:
        return (f"Output exceeded the maximum of {limits.max_output_bytes} bytes "
                "(limits.max_output_bytes); the run was stopped and its output truncated.")
    if kind == ErrorKind.SHUTDOWN:
        return "The gateway shut down before the run finished."
    if kind == ErrorKind.CANCELLED:
        return "The run was cancelled."
    return f"The run was stopped ({kind})."


def _stderr_tail(path: Path) -> str:
    text = spool.read_tail(path, ERROR_TAIL_BYTES)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-ERROR_TAIL_LINES:])


def supervisor_end(status: int | None) -> str:
    """How a supervisor that wrote no end record ended, from its wait status (negative: the
    signal; None: not our child, so unknown), for an error message."""
    if status is None:
        return "died (killed from outside the gateway)"
    if status < 0:
        return (f"was killed by {proc.signal_name(-status)} from outside the gateway (the OOM "
                "killer, or a kill by hand)")
    return f"exited with code {status} without recording the run's end (see {sup.LOG_NAME})"


def _killed_exit_code(status: int | None) -> int | None:
    """128 + the signal, the shell's convention, when the signal is known."""
    return 128 - status if status is not None and status < 0 else None


def unstarted_outcome(spool_dir: Path, stop: tuple[ErrorKind, str] | None,
                      supervisor_status: int | None) -> RunOutcome:
    """The outcome of a run whose supervisor died after it was handed the run and before it
    claimed it (issue 23, item 1): nothing ran, and the launcher has claimed the run so that
    nothing ever will. A stop this gateway asked for (a cancel) names it; else it failed to
    launch."""
    if stop is not None:
        kind, error = stop
    else:
        kind = ErrorKind.LAUNCH_FAILED
        error = (f"The run's supervisor {supervisor_end(supervisor_status)} before it started "
                 "the provider: nothing ran. Resubmit the request.")
    return RunOutcome(
        exit_code=EXIT_CODES.get(kind), error_kind=kind, error=error,
        stdout_path=spool_dir / sup.STDOUT_NAME, stderr_path=spool_dir / sup.STDERR_NAME,
        stdout_bytes=0, stderr_bytes=0, truncated=False, duration_s=0.0,
        extra={"supervisor_lost": True, "never_started": True})


def outcome_from_record(spool_dir: Path, record: dict[str, Any] | None, limits: Limits,
                        stop: tuple[ErrorKind, str] | None,
                        supervisor_status: int | None = None) -> RunOutcome:
    """The outcome of a run whose supervisor is gone. `record` is its end record (None: the
    supervisor died without writing one, after its claim); `stop` is the stop this gateway
    asked for, if any (it names the outcome when the record cannot); `supervisor_status` is
    the supervisor's wait status when it was our child (None: unknown)."""
    stdout_path, stderr_path = spool_dir / sup.STDOUT_NAME, spool_dir / sup.STDERR_NAME
    extra: dict[str, object] = {}
    kind: ErrorKind | None
    exit_code: int | None
    error: str | None
    died_of: int | None = None
    truncated = False
    duration = 0.0
    if record is None:
        # The supervisor claimed the run and died before its end record: the run ran.
        if stop is not None:
            kind, error = stop
            exit_code = EXIT_CODES.get(kind, 1)
        else:
            kind, exit_code = ErrorKind.PROVIDER_ERROR, _killed_exit_code(supervisor_status)
            error = (f"The run's supervisor {supervisor_end(supervisor_status)} while the run "
                     "went on, so the run was stopped; the output so far is kept.")
        extra["supervisor_lost"] = True
        if supervisor_status is not None and supervisor_status < 0:
            extra["supervisor_signal"] = proc.signal_name(-supervisor_status)
    else:
        why = record.get("why")
        returncode = record.get("returncode")
        truncated = bool(record.get("truncated"))
        duration = float(record.get("duration_s") or 0.0)
        if returncode is not None:
            extra["provider_exit_code"] = returncode
        if record.get("strays"):
            extra["stray_processes"] = record["strays"]
        if truncated:
            extra["bytes_written"] = record.get("bytes_written")
        died_of = -returncode if isinstance(returncode, int) and returncode < 0 else None
        if why == sup.WHY_STOP:
            try:
                kind = ErrorKind(record.get("stop_kind") or ErrorKind.CANCELLED)
            except ValueError:
                kind = ErrorKind.CANCELLED
            error = record.get("stop_message") or stop_message(kind, limits)
            exit_code = EXIT_CODES.get(kind)  # None for cancel and shutdown
        elif why in _WHY_KINDS:
            kind = _WHY_KINDS[why]
            error = record.get("error") or stop_message(kind, limits)
            exit_code = EXIT_CODES[kind]
        elif why == sup.WHY_SIGNAL:
            kind, exit_code = ErrorKind.PROVIDER_ERROR, 128 + 15
            error = "The run was stopped by a SIGTERM sent to it from outside the gateway."
        elif truncated:
            kind, error = ErrorKind.OUTPUT_LIMIT, stop_message(ErrorKind.OUTPUT_LIMIT, limits)
            exit_code = EXIT_CODES[kind]
        elif died_of is not None:
            kind = ErrorKind.PROVIDER_ERROR
            exit_code = 128 + died_of  # the shell's convention for "killed by signal N"
            error = f"The provider was killed by {proc.signal_name(died_of)} (not by the gateway)."
            tail = _stderr_tail(stderr_path)
            error = f"{error}\n{tail}" if tail else error
        elif returncode == 0 and record.get("stdin_incomplete"):
            kind, exit_code = ErrorKind.LAUNCH_FAILED, EXIT_CODES[ErrorKind.LAUNCH_FAILED]
            error = "The provider closed stdin before the whole request was delivered."
            extra["stdin_incomplete"] = True
        elif returncode == 0:
            kind, exit_code, error = None, 0, None
        else:
            kind, exit_code = ErrorKind.PROVIDER_ERROR, returncode
            error = _stderr_tail(stderr_path) or (
                f"The provider exited with code {returncode} and wrote nothing to stderr.")
    return RunOutcome(
        exit_code=exit_code, error_kind=kind, error=error, stdout_path=stdout_path,
        stderr_path=stderr_path, stdout_bytes=spool.file_size(stdout_path),
        stderr_bytes=spool.file_size(stderr_path), truncated=truncated, duration_s=duration,
        signal=died_of, extra=extra, ended_at=_ended_at(record))


def _ended_at(record: dict[str, object] | None) -> float | None:
    """When the supervisor recorded the run's end (a record of any version that has it)."""
    value = record.get("ended_at") if record is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
