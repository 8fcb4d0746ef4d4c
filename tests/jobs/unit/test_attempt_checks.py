"""An attempt's check result as read from its supervisor's records (gateway/jobs/attempts/
checks.py): exit codes, stops and timeouts, the output tail without escapes, and why an
ended attempt gets no check (coordinator.skip_reason). No process: the records are written
here as the supervisor writes them (its own write_record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.jobs.attempts import checks
from gateway.jobs.attempts.coordinator import skip_reason
from gateway.jobs.run import supervisor as sup
from gateway.model import JobRow, JobStatus
from gateway.store.attempts import AttemptGroupRow, GroupStatus


def ended(directory: Path, why: str, returncode: int | None, **extra: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    sup.write_record(directory, sup.END_NAME, {"version": sup.RECORD_VERSION, "why": why,
                                               "returncode": returncode, "duration_s": 1.5,
                                               **extra})


def test_no_end_record_is_no_result(tmp_path: Path) -> None:
    assert checks.result_in(tmp_path) is None


@pytest.mark.parametrize(("why", "code", "expected"), [
    (sup.WHY_EXIT, 0, (0, None)),
    (sup.WHY_EXIT, 3, (3, None)),
    (sup.WHY_EXIT, -9, (None, "killed by signal 9")),
    (sup.WHY_TIMEOUT, -15, (None, "timeout")),
    (sup.WHY_OUTPUT, -15, (None, "output_limit")),
    (sup.WHY_STOP, -15, (None, "stopped")),
    (sup.WHY_NOT_FOUND, None, (None, "not_found")),
])
def test_the_end_record_becomes_the_checks_result(tmp_path: Path, why: str, code: int | None,
                                                  expected: tuple[int | None, str | None]) -> None:
    ended(tmp_path, why, code)
    result = checks.result_in(tmp_path)
    assert result is not None
    assert (result.exit_code, result.reason) == expected
    assert result.duration_s == 1.5


def test_the_tail_is_the_last_4_kb_of_stdout_then_stderr_without_escapes(tmp_path: Path) -> None:
    (tmp_path / sup.STDOUT_NAME).write_text("x" * 10_000 + "\x1b[31mFAILED\x1b[0m test_a\n")
    (tmp_path / sup.STDERR_NAME).write_text("\x1b]0;title\x07warning\r\n")
    ended(tmp_path, sup.WHY_EXIT, 1)
    result = checks.result_in(tmp_path)
    assert result is not None
    assert result.output_tail.endswith("FAILED test_a\n\nwarning\n")
    assert "\x1b" not in result.output_tail and "\r" not in result.output_tail
    assert len(result.output_tail) == checks.OUTPUT_TAIL_BYTES


def test_a_launch_failure_keeps_its_message(tmp_path: Path) -> None:
    ended(tmp_path, sup.WHY_NOT_FOUND, None, error="The 'pytest' command was not found.")
    result = checks.result_in(tmp_path)
    assert result is not None and "'pytest' command was not found" in result.output_tail


def group(check: list[str] | None) -> AttemptGroupRow:
    return AttemptGroupRow(group_id="g", dedup_key="k", prompt="p", targets=[], base_sha="a",
                           working_dir="/w", check_argv=check, check_timeout_s=60.0,
                           until="all", judge=None, status=GroupStatus.RUNNING)


def job(status: JobStatus, worktree: dict[str, object] | None) -> JobRow:
    result = json.dumps({"worktree": worktree}) if worktree is not None else None
    return JobRow.from_mapping({"id": "j", "provider": "claude", "status": status,
                                "request_key": "k",
                                "result_json": result})


@pytest.mark.parametrize(("check", "status", "worktree", "reason"), [
    (None, JobStatus.COMPLETED, {"changed": True, "path": "/wt"}, "no_check"),
    (["t"], JobStatus.FAILED, {"changed": True, "path": "/wt"}, "attempt_failed"),
    (["t"], JobStatus.CANCELLED, None, "attempt_cancelled"),
    (["t"], JobStatus.COMPLETED, {"changed": False}, "no_changes"),
    (["t"], JobStatus.COMPLETED, {"changed": True, "path": None}, "worktree_gone"),
    (["t"], JobStatus.COMPLETED, {"changed": True, "path": "/wt"}, None),
])
def test_only_an_attempt_that_completed_with_changes_is_checked(
        check: list[str] | None, status: JobStatus, worktree: dict[str, object] | None,
        reason: str | None) -> None:
    assert skip_reason(group(check), job(status, worktree)) == reason
