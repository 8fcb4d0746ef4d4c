"""An attempt's check: the group's argv run in the attempt's worktree, supervised like a run.

The check is started exactly as a provider's CLI is (run/runner.py `ProcessRun`): a supervisor
forked from the gateway's zygote into a session of its own leads the check's process group,
enforces `check_timeout_s` and the output cap by itself, gives it the run's child environment
(gateway/childenv.py: no secret of the gateway), and records its end atomically
(`end.json`) in the check's own spool dir, `<state dir>/checks/<job id>/`. So a check
outlives its gateway like a run: whoever comes next reads its end record (`result_in`).

It runs at most once: the store's claim (`claim_check`, pending -> running) lets one gateway
start it, and the supervisor's start record (`start.json`, first writer wins) lets one
supervisor run it; a gateway that finds a claim with no start record and its claimer gone
takes that start record itself (`claim_for_requeue`), so a late supervisor never runs it,
and records the check as `interrupted` (it never ran).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gateway.childenv import secret_env_names
from gateway.config import Settings
from gateway.fs import ensure_private_dir
from gateway.jobs.run import spool
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.runner import ProcessRun
from gateway.jobs.run.spec import RunSpec
from gateway.store.attempts import CheckResult
from providers.base import Invocation

CHECKS_DIR = "checks"
OUTPUT_TAIL_BYTES = 4096  # what a comparison shows of a check's output
CHECK_MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # the cap the supervisor enforces on a check
RUN_ID_PREFIX = "check-"  # the check's run id: never a job id (a finalizer finds no job)
# Escape sequences (CSI, OSC, single-character) and other control characters but newline
# and tab: a test runner's colours are noise in a comparison, and unsafe in a terminal.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]"
                      r"|[\x00-\x08\x0b-\x1f\x7f]")


def checks_root(settings: Settings) -> Path:
    return settings.state_dir / CHECKS_DIR


def check_dir(settings: Settings, job_id: str) -> Path:
    return checks_root(settings) / job_id


def without_escapes(text: str) -> str:
    return _ESCAPES.sub("", text)


def run_spec(settings: Settings, job_id: str, argv: list[str], worktree: str,
             timeout_s: float) -> RunSpec:
    """The check as a run: no idle timeout (a test suite may print only at its end)."""
    return RunSpec(job_id=f"{RUN_ID_PREFIX}{job_id}", invocation=Invocation(argv=list(argv)),
                   spool_dir=check_dir(settings, job_id), working_dir=worktree,
                   timeout_s=timeout_s, idle_timeout_s=None,
                   max_output_bytes=CHECK_MAX_OUTPUT_BYTES,
                   kill_grace_s=settings.limits.kill_grace_s,
                   secret_env=secret_env_names(settings))


def prepare_dir(settings: Settings, job_id: str) -> None:
    """The check's private spool dir (0700), fresh."""
    ensure_private_dir(checks_root(settings))
    ensure_private_dir(check_dir(settings, job_id))


def start_run(spec: RunSpec) -> ProcessRun:
    return ProcessRun(spec)


def output_tail(directory: Path) -> str:
    """The last 4 KB of what the check printed (stdout, then stderr), escapes removed."""
    out = spool.read_tail(directory / sup.STDOUT_NAME, OUTPUT_TAIL_BYTES)
    err = spool.read_tail(directory / sup.STDERR_NAME, OUTPUT_TAIL_BYTES)
    text = without_escapes(out + ("\n" if out and err else "") + err)
    return text[-OUTPUT_TAIL_BYTES:]


def result_in(directory: Path) -> CheckResult | None:
    """The check's result from its end record (None: it has not ended, or never started)."""
    record = sup.read_record(directory, sup.END_NAME)
    if record is None:
        return None
    why = record.get("why")
    returncode = record.get("returncode")
    duration = float(record.get("duration_s") or 0.0)
    tail = output_tail(directory)
    if why == sup.WHY_EXIT and isinstance(returncode, int):
        if returncode >= 0:
            return CheckResult(returncode, tail, duration)
        return CheckResult(None, tail, duration, f"killed by signal {-returncode}")
    reasons = {sup.WHY_TIMEOUT: "timeout", sup.WHY_OUTPUT: "output_limit",
               sup.WHY_STOP: "stopped", sup.WHY_SIGNAL: "stopped",
               sup.WHY_NOT_FOUND: "not_found", sup.WHY_LAUNCH: "launch_failed"}
    reason = reasons.get(str(why), str(why))
    error = record.get("error")
    if isinstance(error, str) and error:
        tail = (tail + "\n" + error).strip()[-OUTPUT_TAIL_BYTES:]
    return CheckResult(None, tail, duration, reason)


def started(directory: Path) -> bool:
    """Whether a supervisor (or a taker) holds the check's start record."""
    return sup.read_record(directory, sup.START_NAME) is not None


def take_unstarted(directory: Path, by: str) -> bool:
    """Take the start record of a claimed check whose claimer is gone before it started one:
    True when this caller won it (then no supervisor will ever run that check)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return sup.claim_for_requeue(directory, by)


def remove_dir(settings: Settings, job_id: str) -> None:
    shutil.rmtree(check_dir(settings, job_id), ignore_errors=True)
