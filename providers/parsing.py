"""Tolerant readers for what the CLIs print: JSON lines, one JSON document, plain text.

CLIs print banners, warnings, ANSI colour and half-written lines (a run killed mid-stream).
Nothing here raises on bad input: a reader returns what it could understand and skips the
rest, so an adapter can always produce its best ProviderResult.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# CSI sequences (colours, cursor moves) and OSC sequences (titles, hyperlinks).
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def decode(data: bytes | str | None) -> str:
    """Bytes to text; invalid UTF-8 (a multi-byte character cut by a kill) becomes U+FFFD."""
    if data is None:
        return ""
    if isinstance(data, str):
        return data
    return data.decode("utf-8", errors="replace")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every line of `text` that is a JSON object, in order; other lines are skipped."""
    for raw in text.splitlines():
        line = strip_ansi(raw).strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def json_document(text: str) -> Any | None:
    """The one JSON value `text` holds, even with junk before or after it; else None.

    Tries the whole text, then the span from the first '{' (or '[') to the last '}' (or
    ']'), then each line from the last one up (a banner line, then the JSON line).
    """
    cleaned = strip_ansi(text).strip()
    if not cleaned:
        return None
    try:
        return json.loads(cleaned)
    except ValueError:
        pass
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = cleaned.find(opener), cleaned.rfind(closer)
        if 0 <= start < end:
            try:
                return json.loads(cleaned[start : end + 1])
            except ValueError:
                pass
    for line in reversed(cleaned.splitlines()):
        line = line.strip()
        if line[:1] in ("{", "["):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def as_int(value: Any) -> int | None:
    """An int from a JSON number (or numeric string); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_str(value: Any) -> str | None:
    """A non-empty string, or None."""
    return value if isinstance(value, str) and value else None


def tail(text: str, limit: int = 4000) -> str:
    """The last `limit` characters: where a CLI's error message usually is."""
    return text[-limit:]


def plain_text(stdout: bytes | str | None) -> str:
    """A plain-text answer: ANSI removed, surrounding blank lines trimmed."""
    return strip_ansi(decode(stdout)).strip("\n").rstrip()
