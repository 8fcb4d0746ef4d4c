"""The server-sent event streams that keep an open page current without a reload.

The jobs table: its page is read again every LIVE_POLL_S (one indexed read of at most a
page of light rows) and sent when any row's status, cancel request or update time differs
from what the page holds, so a status change written by any gateway sharing the store shows
within a second. The job page: its status, and its output as it arrives, by the partial
output rule of `jobs tail -f` (gateway.jobs.tail.Follower: this host's spool file, else the
tail its owner flushes to the row, then the stored output once it ends).
"""

from __future__ import annotations

import codecs
import io
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import BinaryIO, cast

import anyio

from gateway.config import Settings
from gateway.dashboard.views import shown
from gateway.jobs.tail import TAIL_POLL_S, Follower, parser_for
from gateway.model import JobRow
from gateway.store.base import JobsPage, JobStore

LIVE_POLL_S = 0.3  # the jobs table's re-read: a change shows well within the 1 s promised
KEEPALIVE_S = 15.0  # an SSE comment this often keeps proxies and the browser's timer content
RETRY_MS = 1000  # how soon the browser reconnects a dropped stream


def event(name: str, data: str) -> str:
    """One SSE event; a multi-line payload as several `data:` lines (the browser joins
    them with newlines)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {name}\n{lines}\n"


def fingerprint(rows: list[JobRow]) -> tuple[tuple[object, ...], ...]:
    """What must change for a row of the table to be sent again (the ages and running
    times move every second; they catch up with the next change, or a reload)."""
    return tuple((r.id, r.status.value, r.updated_at, r.cancel_requested_at, r.output_bytes)
                 for r in rows)


async def jobs_stream(store: JobStore, page: JobsPage,
                      render: Callable[[list[JobRow], float], str],
                      disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    last: tuple[tuple[object, ...], ...] | None = None
    quiet_since = time.monotonic()
    while not await disconnected():
        rows = await store.list_jobs_page(page)
        now = await store.now()
        mark = fingerprint(rows)
        if mark != last:
            last = mark
            yield event("rows", render(rows, now))
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()
        await anyio.sleep(LIVE_POLL_S)


class _Sink(io.RawIOBase):
    """Where the Follower writes: bytes held until the stream sends them as text."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        chunk = bytes(data)  # type: ignore[call-overload]
        self.buffer += chunk
        return len(chunk)

    def take(self, final: bool = False) -> str:
        text = self._decoder.decode(bytes(self.buffer), final=final)
        self.buffer.clear()
        return text


async def job_stream(settings: Settings, store: JobStore, job_id: str,
                     render_status: Callable[[JobRow, float], str],
                     disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    """`status` events (the header and timeline, when they change), `tail` events (a JSON
    string of new output, escapes stripped), `note` events (a gap the owner's flushes left)
    and `end` once the job is terminal and its stored output was sent."""
    yield f"retry: {RETRY_MS}\n\n"
    row = await store.get_job(job_id, with_output=False)
    if row is None:
        yield event("end", "gone")
        return
    sink = _Sink()
    notes: list[str] = []
    follower = Follower(settings, store, job_id, False, cast(BinaryIO, sink),
                        parser=parser_for(row), note=notes.append)
    last_status = ""
    while not await disconnected():
        status = render_status(row, await store.now())
        if status != last_status:
            last_status = status
            yield event("status", status)
        if row.status.is_terminal:
            await follower.finish(row)
        else:
            await follower.poll_running(row)
        for note in notes:
            yield event("note", json.dumps(shown(note)))
        notes.clear()
        text = sink.take(final=row.status.is_terminal)
        if text:
            yield event("tail", json.dumps(shown(text)))
        if row.status.is_terminal:
            yield event("end", row.status.value)
            return
        await anyio.sleep(TAIL_POLL_S)
        fresh = await store.get_job(job_id, with_output=False)
        if fresh is None:
            yield event("end", "gone")
            return
        row = fresh
