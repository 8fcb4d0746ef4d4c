"""How the CLI shows things to a person: tables, colour, times and sizes.

Colour only when stdout is a terminal and NO_COLOR is unset (https://no-color.org) and TERM
is not `dumb`; a pipe or a file gets plain text, so scripts and `grep` see no escapes.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from gateway.model import JobStatus

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


def duration(seconds: float | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h03m, 3d04h."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


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
