"""Tolerant readers for what the CLIs print: JSON lines, one JSON document, plain text.

CLIs print banners, warnings, ANSI colour and half-written lines (a run killed mid-stream).
Nothing here raises on bad input: a reader returns what it could understand and skips the
rest, so an adapter can always produce its best ProviderResult. `Stdout` runs the same
readers over an output of any size (a spool file) in bounded memory.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from neutral.utf8 import char_boundary

TAIL_CHARS = 4000  # what `tail` keeps: the end of a CLI's output, where its error message is

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


def as_str(value: Any) -> str | None:
    """A non-empty string, or None."""
    return value if isinstance(value, str) and value else None


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    """The last `limit` characters: where a CLI's error message usually is."""
    return text[-limit:]


def plain_text(stdout: bytes | str | None) -> str:
    """A plain-text answer: ANSI removed, surrounding blank lines trimmed."""
    return strip_ansi(decode(stdout)).strip("\n").rstrip()


# -- stdout of any size, read in chunks ------------------------------------------------------

READ_CHUNK_BYTES = 256 * 1024  # one read of a spooled stdout: what a reader holds besides its line
LINE_HEAD_BYTES = 4096  # enough of a line to see, past blanks and ANSI codes, whether it opens '{'
WHOLE_DOCUMENT_BYTES = 1024 * 1024  # up to this size json_document parses the text the simple way
_LINE_BREAK = re.compile(rb"[\r\n]")
# What may follow '{' / '[' (after blanks) in a JSON document: a cheap test that spares
# parsing (and holding) a large plain text as JSON only because it has a brace in it.
_AFTER_OPENER = {ord("{"): b'"}', ord("["): b'{["-0123456789tfn]'}
_BLANK_BYTES = b" \t\r\n"


class Stdout:
    """A run's stdout for the readers below: bytes in memory, or a file of any size.

    Every reader makes its own pass in chunks of `chunk_bytes`, so what it holds is a chunk
    plus the one line or document it parses, never the whole output: a spooled stdout can be
    limits.max_output_bytes. A missing file reads as empty.
    """

    def __init__(self, source: bytes | Path, chunk_bytes: int = READ_CHUNK_BYTES) -> None:
        self._source = source
        self.chunk_bytes = max(1, chunk_bytes)

    @classmethod
    def of(cls, stdout: bytes | Stdout) -> Stdout:
        return stdout if isinstance(stdout, Stdout) else cls(stdout)

    @property
    def size(self) -> int:
        if isinstance(self._source, bytes):
            return len(self._source)
        try:
            return self._source.stat().st_size
        except FileNotFoundError:
            return 0

    def _open(self) -> BinaryIO:
        if isinstance(self._source, bytes):
            return io.BytesIO(self._source)  # shares the bytes until written to: no copy
        try:
            return self._source.open("rb")
        except FileNotFoundError:
            return io.BytesIO(b"")

    def chunks(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes from `start` up to `end` (the end of stdout if None), chunk by chunk."""
        with self._open() as fh:
            fh.seek(start)
            position = start
            while end is None or position < end:
                want = self.chunk_bytes if end is None else min(self.chunk_bytes, end - position)
                chunk = fh.read(want)
                if not chunk:
                    return
                position += len(chunk)
                yield chunk

    def read(self, start: int = 0, end: int | None = None) -> bytes:
        """The bytes from `start` up to `end`, in one piece: for ranges the caller bounded."""
        return b"".join(self.chunks(start, end))

    def json_objects(self) -> Iterator[dict[str, Any]]:
        """Every line that is a JSON object, in order; other lines are skipped as they stream
        past, however long. Lines end at \\n or \\r (a raw U+2028, which JSON allows inside a
        string and Node's JSON.stringify leaves unescaped, does not cut a line)."""
        for line in self._lines(_opens_object):
            value = _json_or_none(strip_ansi(decode(line)).strip())
            if isinstance(value, dict):
                yield value

    def json_document(self) -> Any | None:
        """What `json_document` finds in the text, without holding a large text that cannot
        be a JSON document: past WHOLE_DOCUMENT_BYTES only an object or an array is looked
        for, and a span is read only when what follows its opening bracket can start JSON.
        ANSI codes would shift every offset: such an output is read whole (the CLIs run with
        NO_COLOR=1 and TERM=dumb, so it is rare)."""
        if self.size <= WHOLE_DOCUMENT_BYTES:
            return json_document(decode(self.read()))
        scan = self._scan()
        if scan.escape:
            return json_document(decode(self.read()))
        tried: set[tuple[int, int]] = set()
        for start, end in scan.spans():
            if (start, end) in tried:
                continue
            tried.add((start, end))
            if self._may_open_json(start):
                value = _json_or_none(decode(self.read(start, end + 1)).strip())
                if value is not None:
                    return value
        last: Any | None = None
        for line in self._lines(_opens_container):
            value = _json_or_none(decode(line).strip())
            if value is not None:
                last = value  # the last line that parses, as json_document reads them
        return last

    def tail(self, limit: int = TAIL_CHARS) -> str:
        """The last `limit` characters (ANSI codes removed): where a CLI's error message is."""
        window = max(0, self.size - 4 * limit)  # a UTF-8 character is at most 4 bytes
        data = self.read(window)
        # A character cut by the window is not part of the tail.
        start = char_boundary(data, 0, forward=True) if window else 0
        return tail(strip_ansi(decode(data[start:])), limit)

    def _lines(self, keep: Callable[[bytes, bool], bool | None]) -> Iterator[bytes]:
        """Each line `keep` accepts, whole. `keep(head, complete)` judges a line by its first
        LINE_HEAD_BYTES: True (keep), False (skip it as it streams past), None (undecided
        yet: only while the line is incomplete and shorter than that)."""
        line = bytearray()
        verdict: bool | None = None
        for chunk in self.chunks():
            position = 0
            while position < len(chunk):
                found = _LINE_BREAK.search(chunk, position)
                end = found.start() if found else len(chunk)
                if verdict is not False:
                    line += chunk[position:end]
                    if verdict is None:
                        verdict = keep(bytes(line[:LINE_HEAD_BYTES]), found is not None)
                        if verdict is False:
                            line.clear()
                if found is None:
                    break
                if verdict and line:
                    yield bytes(line)
                line.clear()
                verdict = None
                position = end + 1
        if verdict is None and line:
            verdict = keep(bytes(line[:LINE_HEAD_BYTES]), True)
        if verdict and line:
            yield bytes(line)

    def _scan(self) -> _Scan:
        """One pass: where the text's ends and its outermost brackets are."""
        scan = _Scan()
        offset = 0
        for chunk in self.chunks():
            if b"\x1b" in chunk:
                scan.escape = True
                return scan
            head = chunk.lstrip(_BLANK_BYTES)
            if head and scan.first < 0:
                scan.first = offset + len(chunk) - len(head)
                scan.first_byte = head[0]
            body = chunk.rstrip(_BLANK_BYTES)
            if body:
                scan.last = offset + len(body) - 1
                scan.last_byte = body[-1]
            del head, body
            for opener in (b"{", b"["):
                if opener not in scan.openers and (at := chunk.find(opener)) >= 0:
                    scan.openers[opener] = offset + at
            for closer in (b"}", b"]"):
                if (at := chunk.rfind(closer)) >= 0:
                    scan.closers[closer] = offset + at
            offset += len(chunk)
        return scan

    def _may_open_json(self, start: int) -> bool:
        """Whether what follows the bracket at `start` (past blanks) can continue JSON."""
        head = self.read(start, start + 1 + LINE_HEAD_BYTES)
        rest = head[1:].lstrip(_BLANK_BYTES)
        return not rest or rest[0] in _AFTER_OPENER[head[0]]


class _Scan:
    """Byte offsets found by Stdout._scan (-1: none)."""

    def __init__(self) -> None:
        self.escape = False  # an ESC byte: ANSI codes, so offsets in the cleaned text differ
        self.first = self.last = -1  # the first and last non-blank bytes
        self.first_byte = self.last_byte = 0
        self.openers: dict[bytes, int] = {}  # the first '{' and '['
        self.closers: dict[bytes, int] = {}  # the last '}' and ']'

    def spans(self) -> Iterator[tuple[int, int]]:
        """The spans json_document tries, in its order: the whole text when it is bracketed,
        then from the first '{' to the last '}', then '[' to ']'. Only objects and arrays:
        a scalar document is of no use to an adapter."""
        if (self.first_byte, self.last_byte) in ((ord("{"), ord("}")), (ord("["), ord("]"))):
            yield self.first, self.last
        for opener, closer in ((b"{", b"}"), (b"[", b"]")):
            start, end = self.openers.get(opener, -1), self.closers.get(closer, -1)
            if 0 <= start < end:
                yield start, end


def _opens_object(head: bytes, complete: bool) -> bool | None:
    """Whether a line starting with `head` can be a JSON object (see Stdout._lines)."""
    return _opens(head, complete, "{")


def _opens_container(head: bytes, complete: bool) -> bool | None:
    return _opens(head, complete, "{[")


def _opens(head: bytes, complete: bool, openers: str) -> bool | None:
    text = strip_ansi(decode(head)).lstrip()
    if text[:1] and text[0] in openers:
        return True
    if complete or len(head) >= LINE_HEAD_BYTES:
        return False
    # Only blanks so far, or an ANSI code still arriving: the next chunk decides.
    return None if not text or text[0] == "\x1b" else False


def _json_or_none(text: str) -> Any | None:
    try:
        return json.loads(text)
    except ValueError:
        return None
