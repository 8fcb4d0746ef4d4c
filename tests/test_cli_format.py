"""The operator CLI's formatting (gateway/cli/format.py): tables that fit a terminal, sizes
and times for a person, and job output shown visibly on a terminal but byte-exact elsewhere.
Pure functions and in-memory streams: the fast tier."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway.cli.format import (
    ELLIPSIS,
    MIN_LAST_COLUMN,
    VisibleWriter,
    ago,
    cut,
    first_line,
    iso,
    paint,
    size,
    table,
    terminal_safe,
    use_colour,
    visible_data,
)


def test_a_table_aligns_its_columns_and_cuts_only_the_last_to_the_width() -> None:
    rows = [["a1b2", "running", "x" * 40], ["c3", "completed", "short"]]
    lines = table(["ID", "STATUS", "PROMPT"], rows, width=30)
    assert lines[0] == "ID    STATUS     PROMPT"
    assert lines[2] == "c3    completed  short"
    # 4 + 9 columns and two gaps of 2 leave 13 for the prompt: cut with an ellipsis.
    assert lines[1] == "a1b2  running    " + "x" * 12 + ELLIPSIS
    assert all(len(line) <= 30 for line in lines)


def test_a_narrow_terminal_still_leaves_the_last_column_its_minimum() -> None:
    lines = table(["NAME", "TEXT"], [["n" * 40, "y" * 40]], width=10)
    assert lines[1] == "n" * 40 + "  " + "y" * (MIN_LAST_COLUMN - 1) + ELLIPSIS


def test_colours_never_skew_the_alignment() -> None:
    plain = table(["A", "B"], [["1", "two"], ["333", "4"]])
    coloured = table(["A", "B"], [["1", "two"], ["333", "4"]],
                     colours=[["\033[32m", ""], ["", "\033[31m"]])
    assert coloured[0] == plain[0]  # the header is never painted
    assert coloured[1].startswith("\033[32m1  \033[0m  two")
    unpainted = [re.sub(r"\033\[[0-9;]*m", "", line).rstrip() for line in coloured]
    assert unpainted == plain
    assert paint("x", "\033[1m", colour=False) == "x"


@pytest.mark.parametrize(("count", "shown"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3_500_000, "3.3 MiB"),
    (5 * 1024**4, "5120.0 GiB"),
])
def test_sizes_for_a_person(count: int, shown: str) -> None:
    assert size(count) == shown


def test_times_for_a_person_and_for_json() -> None:
    moment = datetime(2026, 12, 7, 18, 30, 5, 123456, tzinfo=UTC)
    assert iso(moment) == "2026-12-07T18:30:05Z"
    assert iso(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-12-07T18:30:05Z"
    assert iso(None) is None
    now = moment.timestamp()
    assert ago(moment - timedelta(minutes=5), now) == "5m00s ago"
    assert ago(moment + timedelta(seconds=20), now) == "in 20.0s"
    assert ago(None, now) == "-"


def test_cut_and_first_line() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcdef", 4) == "abc" + ELLIPSIS
    assert cut("abcdef", 0) == ""
    assert first_line("\n  \n  the answer  \nmore") == "the answer"
    assert first_line(None) == "" and first_line(" \n ") == ""


def test_job_data_is_shown_visibly_all_the_way_down() -> None:
    shown = visible_data({"prompt": "a\x1b[2Jb", "tags": ["ok", "\x07"], "n": 3, "none": None})
    assert shown == {"prompt": "a^[[2Jb", "tags": ["ok", "^G"], "n": 3, "none": None}


class _Tty(io.BytesIO):
    def isatty(self) -> bool:
        return True


def test_output_is_byte_exact_off_a_terminal_and_visible_on_one() -> None:
    pipe = io.BytesIO()
    assert terminal_safe(pipe) is pipe
    tty = _Tty()
    writer = terminal_safe(tty)
    assert isinstance(writer, VisibleWriter)
    snowman = "☃".encode()
    writer.write(b"esc \x1b" + snowman[:1])  # a character split across two writes
    writer.write(snowman[1:] + b" bad \xff")
    writer.flush()
    assert tty.getvalue().decode("utf-8", errors="surrogateescape") == \
        "esc ^[☃ bad <ff>"


def test_colour_only_on_a_terminal_that_has_not_said_no(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour(io.StringIO()) is False  # not a terminal
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    assert use_colour(tty) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_colour(tty) is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert use_colour(tty) is False
