"""The spool layout and its reads: tails never split a UTF-8 character (gateway/jobs/run/spool.py),
and the one boundary rule they share with result pages and `Stdout.tail`
(providers.parsing.char_boundary)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.jobs.run import spool
from gateway.jobs.run.spool import read_tail
from gateway.model import JobRow, JobStatus
from neutral.utf8 import char_boundary

TEXT = "aé€😀".encode()  # 1 + 2 + 3 + 4 bytes: boundaries at 0, 1, 3, 6, 10


def test_read_tail_never_splits_a_character(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(TEXT)
    for max_bytes in range(1, 11):
        text = read_tail(path, max_bytes)
        assert "\ufffd" not in text
        assert "aé€😀".endswith(text)
        assert len(text.encode()) <= max_bytes
    assert read_tail(path, 4) == "😀"
    assert read_tail(path, 3) == ""


def test_read_tail_leaves_out_a_character_still_being_written(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"ok" + "€".encode()[:2])
    assert read_tail(path, 100) == "ok"


def test_read_tail_replaces_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"a\xffb")
    assert read_tail(path, 100) == "a\ufffdb"


def test_read_tail_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_tail(tmp_path / "nothing", 10) == ""


def test_each_launch_attempt_of_a_job_has_a_dir_of_its_own_under_the_job_s(
        tmp_path: Path) -> None:
    # A launcher that lost its job to a re-queue must never share a dir with the new run.
    root = spool.spool_root(tmp_path)
    first = JobRow(id="job-1", provider="claude", status=JobStatus.RUNNING, request_key="k")
    again = replace(first, requeued_at=datetime(2026, 12, 1, 15, 0, 0, 123456, tzinfo=UTC))
    assert again.requeued_at is not None
    later = replace(again, requeued_at=again.requeued_at + timedelta(microseconds=1))
    dirs = [spool.run_dir(root, row) for row in (first, again, later)]
    assert dirs[0] == root / "job-1" / "0"
    assert len(set(dirs)) == 3 and all(d.parent == root / "job-1" for d in dirs)
    assert spool.run_dir(root, replace(again)) == dirs[1]  # the same row, the same dir


def test_the_spool_layout_has_one_name_per_file(tmp_path: Path) -> None:
    job_dir = spool.spool_root(tmp_path) / "job-1"
    assert job_dir == tmp_path / "spool" / "job-1"
    names = {spool.stdout_path(job_dir).name, spool.stderr_path(job_dir).name,
             spool.clean_stdout_path(spool.stdout_path(job_dir)).name}
    assert names == {"stdout", "stderr", "stdout.utf8"}
    assert spool.clean_stdout_path(spool.stdout_path(job_dir)).parent == job_dir


@pytest.mark.parametrize(("index", "back", "forward"), [
    (0, 0, 0), (1, 1, 1), (2, 1, 3), (3, 3, 3), (4, 3, 6), (5, 3, 6), (6, 6, 6),
    (7, 6, 10), (8, 6, 10), (9, 6, 10), (10, 10, 10), (11, 11, 11), (-1, -1, -1),
])
def test_char_boundary_moves_a_cut_to_a_character_start(index: int, back: int,
                                                        forward: bool) -> None:
    assert char_boundary(TEXT, index) == back
    assert char_boundary(TEXT, index, forward=True) == forward


def test_char_boundary_of_a_window_that_starts_mid_character() -> None:
    window = TEXT[4:]  # the last two bytes of "€", then "😀"
    assert char_boundary(window, 0) == 0  # nothing before the window to move back to
    assert char_boundary(window, 0, forward=True) == 2


def test_char_boundary_gives_up_on_bytes_that_are_not_utf8() -> None:
    junk = b"\x80" * 10  # continuation bytes only: no character starts anywhere
    assert char_boundary(junk, 5) == 2
    assert char_boundary(junk, 5, forward=True) == 8
    assert char_boundary(junk, 0, forward=True) == 3
