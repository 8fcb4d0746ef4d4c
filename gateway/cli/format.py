"""How the CLI shows things to a person: tables, colour, times and sizes.

Colour only when stdout is a terminal and NO_COLOR is unset (https://no-color.org) and TERM
is not `dumb`; a pipe or a file gets plain text, so scripts and `grep` see no escapes.

Job data (a CLI's output, its stderr, an error, a prompt) is whatever the agent printed, and
an escape sequence in it would act on the operator's terminal: set its title, clear the
screen, write the clipboard (OSC 52), erase lines. So every control character in job data
is shown visibly, as `less` and `git` do (`visible`): C0 as caret notation (`^[`), DEL as
`^?`, C1 (U+0080-U+009F, such as the one-character CSI U+009B) and a byte that is not UTF-8
as `<9b>`, bidi overrides as `<U+202E>`. Human views (`jobs list`, `jobs show`, error
lines) always get it; byte streams (`jobs result`, `jobs tail`, `run`'s answer) get it on a
terminal only (`terminal_safe`), so `--raw` or `> file` through a pipe stays byte-exact.
"""

from __future__ import annotations

import codecs
import io
import os
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, BinaryIO, TextIO, cast

from gateway.model import JobStatus
from neutral.durations import duration
from neutral.visible import visible as visible  # re-exported: the CLI shows job data with it

FALLBACK_COLUMNS = 100  # the width assumed when stdout is not a terminal
MIN_LAST_COLUMN = 12  # a cut-down last column keeps at least this much
ELLIPSIS = "…"

_RESET = "\033[0m"
STATUS_COLOURS = {
    JobStatus.QUEUED: "\033[36m",  # cyan
    JobStatus.RUNNING: "\033[34;1m",  # bold blue
    JobStatus.COMPLETED: "\033[32m",  # green
    JobStatus.FAILED: "\033[31;1m",  # bold red
    JobStatus.TIMED_OUT: "\033[31m",  # red
    JobStatus.CANCELLED: "\033[33m",  # yellow
    JobStatus.ORPHANED: "\033[35m",  # magenta
}
DIM = "\033[2m"


def visible_data(value: Any) -> Any:
    """`visible` over every string in a JSON-like value (a job's details for `jobs show`)."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {k: visible_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_data(v) for v in value]
    return value


class VisibleWriter(io.RawIOBase):
    """A byte stream that passes job output through `visible` on its way to a terminal.
    UTF-8 split across writes is reassembled (an incremental decoder); bytes that are not
    UTF-8 come out as `<xx>`."""

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        text = self._decoder.decode(bytes(data))
        self._stream.write(visible(text).encode("utf-8", errors="surrogateescape"))
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


def terminal_safe(stream: BinaryIO) -> BinaryIO:
    """`stream` itself when it is a pipe or a file (byte-exact), else a VisibleWriter."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return cast(BinaryIO, VisibleWriter(stream)) if tty else stream


def use_colour(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, code: str, colour: bool) -> str:
    return f"{code}{text}{_RESET}" if colour and code else text


def terminal_columns() -> int:
    """The terminal's width (COLUMNS wins), or FALLBACK_COLUMNS off a terminal."""
    return shutil.get_terminal_size((FALLBACK_COLUMNS, 24)).columns


def cut(text: str, width: int) -> str:
    """`text` fit in `width` characters, an ellipsis marking a cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def first_line(text: str | None) -> str:
    """The first non-blank line of `text`, stripped ("" if none)."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def iso(moment: datetime | None) -> str | None:
    """An ISO 8601 UTC timestamp (seconds), or None."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ago(moment: datetime | None, now: float) -> str:
    """`moment` relative to `now` (epoch seconds): `5m ago`, `in 20s`."""
    if moment is None:
        return "-"
    delta = now - moment.timestamp()
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


def size(count: int) -> str:
    """Bytes for a person: 512 B, 3.4 KiB, 12.0 MiB."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}"
    return f"{count} B"  # pragma: no cover - the loop always returns


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, width: int | None = None,
          colours: Sequence[Sequence[str]] | None = None) -> list[str]:
    """Aligned columns; the last one is cut so each line fits `width` characters.

    `colours` (per cell, "" for none) is applied after the widths are measured, so escape
    codes never skew the alignment.
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    if width is not None:
        fixed = sum(widths[:-1]) + 2 * (len(widths) - 1)
        widths[-1] = min(widths[-1], max(MIN_LAST_COLUMN, width - fixed))
    lines = []
    for index, row in enumerate([header, *rows]):
        cells = []
        for column, (cell, cell_width) in enumerate(zip(row, widths, strict=True)):
            text = cut(cell, cell_width) if column == len(widths) - 1 else cell
            padded = text.ljust(cell_width)
            code = colours[index - 1][column] if colours and index > 0 else ""
            cells.append(paint(padded, code, bool(code)))
        lines.append("  ".join(cells).rstrip())
    return lines
