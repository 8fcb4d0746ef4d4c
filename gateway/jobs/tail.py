"""Following a job's output as it arrives: the one partial-output rule of `jobs tail -f` and
the dashboard's live tail.

Where the bytes come from is the rule result pages follow (`gateway.jobs.reads.live_stdout`):
a job running on this host (same hostname, and its spool file is in our state dir and
readable) is read from its spool file, every byte; any other running job from its row, where
the owner flushes the last part of stdout every few seconds (a gap the flushes skipped is
announced through `note`, never invented). Once the job is terminal the rest comes from the
stored output, which is the whole of it.

Parsed (the default): the provider's own parser turns what arrived so far into the answer
text, and what extends the text already shown is emitted; at the end the stored answer
completes it (or, when it is not a continuation of the live view, follows it whole). Raw:
the CLI's stdout byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import anyio

from gateway import proc
from gateway.config import Settings
from gateway.jobs.reads import live_stdout
from gateway.jobs.requests import stored_fields
from gateway.jobs.run.spool import spool_root
from gateway.model import JobRow
from gateway.store.base import JobStore
from providers.registry import CLI_PROVIDERS

TAIL_POLL_S = 0.25  # how often a follower looks for new output: well under a person's patience
READ_CHUNK_BYTES = 256 * 1024  # one read of a spool file or one page of the stored output
LIVE_PARSE_MAX_BYTES = 8 * 1024 * 1024  # past this the live parsed view stops (reparsing
# the whole stream each poll would cost more than it shows); the final answer still prints


def _unheard(_message: str) -> None:
    """A follower nobody gave a place for its remarks: they go nowhere (never stdout)."""


def parser_for(row: JobRow) -> tuple[Any, Any] | None:
    """(adapter, options) to parse this job's stream with, or None (raw only)."""
    if row.transport != "process":
        return None
    adapter = CLI_PROVIDERS.get(row.provider)
    if adapter is None:
        return None
    try:
        options = adapter.options_model.model_validate(
            stored_fields(row.request_json).get("options") or {})
    except ValueError:  # pydantic's ValidationError: options this adapter no longer takes
        return None
    return adapter, options


@dataclass
class Follower:
    """The state of one tail: how much of stdout, and of the parsed answer, is out."""

    settings: Settings
    store: JobStore
    job_id: str
    raw: bool
    out: BinaryIO
    pos: int = 0  # stdout bytes consumed
    seen: bytearray = field(default_factory=bytearray)  # stdout so far (parsed mode)
    shown: str = ""  # parsed text printed so far
    printed_any: bool = False
    ended_with_newline: bool = True
    live_parse: bool = True
    parser: tuple[Any, Any] | None = None
    from_spool: bool = False  # once read from the spool, never from the row (other offsets)
    # Where a remark about the stream goes (a gap, the live view stopping): the CLI's
    # stderr, the dashboard's page; never mixed into the output itself.
    note: Callable[[str], None] = _unheard

    def emit(self, data: bytes) -> None:
        if not data:
            return
        self.before_output()
        self.out.write(data)
        self.out.flush()
        self.printed_any = True
        self.ended_with_newline = data.endswith(b"\n")

    def before_output(self) -> None:
        """A hook for what must go before the first output (the CLI's waiting line)."""

    # -- running -----------------------------------------------------------------------
    async def poll_running(self, row: JobRow) -> None:
        """Print what arrived since the last poll (all of it: a file is read to its end)."""
        grew = False
        while data := await self._new_stdout(row):
            if self.raw or self.parser is None:
                self.emit(data)
            elif self.live_parse:
                self.seen += data
                grew = True
        if grew:
            self._render()

    def _render(self) -> None:
        """Parse the stream so far; print what extends the text already shown."""
        if len(self.seen) > LIVE_PARSE_MAX_BYTES:
            self.live_parse = False
            self.seen = bytearray()
            self.note(f"[output past {LIVE_PARSE_MAX_BYTES} bytes: the live view stops here; "
                      f"the answer follows when the job ends]")
            return
        assert self.parser is not None
        adapter, options = self.parser
        try:
            text = adapter.parse_output(bytes(self.seen), b"", None, options).text or ""
        except Exception:  # a stream cut mid-event: wait for more
            return
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.emit(text[len(self.shown):].encode())
            self.shown = text

    async def _new_stdout(self, row: JobRow) -> bytes:
        found = await anyio.to_thread.run_sync(
            live_stdout, spool_root(self.settings.state_dir), proc.hostname(), row, self.pos,
            READ_CHUNK_BYTES)
        if found is not None:
            self.from_spool = True
            data, _ = found
            self.pos += len(data)
            return data
        if self.from_spool:
            # The spool went with the job's end: the rest comes from the terminal row.
            return b""
        return await self._new_from_row(row)

    async def _new_from_row(self, row: JobRow) -> bytes:
        """New bytes out of the tail the owner flushed into the row (output_bytes: total).

        The tail is trusted only when the row read before it and the one read after it
        agree (the same flush, still running): a flush in between, or the job's end (the
        row then holds the whole output, which `finish` prints), makes this poll skip."""
        total = row.output_bytes
        if total <= self.pos:
            return b""
        found = await self.store.read_output(row.id, 0, READ_CHUNK_BYTES * 4)
        after = await self.store.get_job(row.id, with_output=False)
        if (found is None or after is None or after.status.is_terminal
                or after.output_bytes != total):
            return b""
        tail, _ = found
        new = total - self.pos
        if new > len(tail):
            self.note(f"[{new - len(tail)} bytes of output not shown: the owner flushed only "
                      f"the last {len(tail)}]")
            new = len(tail)
        self.pos = total
        return tail[len(tail) - new:]

    # -- ended -------------------------------------------------------------------------
    async def finish(self, row: JobRow) -> None:
        """Print what is left once the row is terminal (its stored output is whole)."""
        if self.raw or self.parser is None:
            await self._stream_stored(self.pos, answer=False)
        else:
            await self._finish_parsed()
        if self.printed_any and not self.ended_with_newline:
            self.emit(b"\n")

    async def _finish_parsed(self) -> None:
        shown = self.shown.encode()
        if shown:
            head = await self.store.read_output(self.job_id, 0, len(shown), answer=True)
            if head is not None and head[0] == shown:
                await self._stream_stored(len(shown), answer=True)
                return
            if not self.ended_with_newline:
                self.emit(b"\n")
            self.note("[the final answer:]")
        await self._stream_stored(0, answer=True)

    async def _stream_stored(self, offset: int, *, answer: bool) -> None:
        while True:
            found = await self.store.read_output(self.job_id, offset, READ_CHUNK_BYTES,
                                                 answer=answer)
            if found is None or not found[0]:
                return
            page, total = found
            self.emit(page)
            offset += len(page)
            if offset >= total:
                return
