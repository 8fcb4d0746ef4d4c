"""`jobs tail ID [-f] [--raw]`: a job's output so far and, with -f, as it arrives.

The rule of where the bytes come from, and of the parsed view, is gateway.jobs.tail's (the
dashboard's live tail follows it too); this module adds the terminal: a "waiting for its
first output" line on stderr, and -f's loop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import anyio

from gateway.cli.version import PROG
from gateway.config import Settings
from gateway.jobs.tail import TAIL_POLL_S, Follower, parser_for
from gateway.model import JobRow
from gateway.store.base import JobStore
from neutral.durations import duration


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass
class TerminalFollower(Follower):
    """A Follower whose remarks go to stderr, with a waiting line on a terminal's stderr."""

    note: Callable[[str], None] = to_stderr
    waiting_shown: bool = False  # a "waiting for output" line is on the terminal (stderr)

    def before_output(self) -> None:
        self.clear_waiting()

    def show_waiting(self, row: JobRow, waited_s: float) -> None:
        """Until the first output, a line on a terminal's stderr that says the job is
        there and running (as `jobs wait` shows), rewritten in place, cleared before any
        output; nothing of it reaches stdout, a pipe or a file."""
        print(f"\r{PROG}: job {row.id[:8]} {row.status.value}, waiting for its first output "
              f"({duration(waited_s)})\033[K", end="", file=sys.stderr, flush=True)
        self.waiting_shown = True

    def clear_waiting(self) -> None:
        if self.waiting_shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.waiting_shown = False


async def follow_job(settings: Settings, store: JobStore, job_id: str, *, follow: bool,
                     raw: bool, out: BinaryIO) -> JobRow:
    """Print the job's output (see the module doc); returns the last row read."""
    row = await store.get_job(job_id, with_output=False)
    assert row is not None
    follower = TerminalFollower(settings, store, job_id, raw, out, parser=parser_for(row))
    waiting_line = follow and sys.stderr.isatty()
    started = time.monotonic()
    while True:
        if row.status.is_terminal:
            follower.clear_waiting()
            await follower.finish(row)
            return row
        await follower.poll_running(row)
        if waiting_line and not follower.printed_any:
            follower.show_waiting(row, time.monotonic() - started)
        if not follow:
            if follower.printed_any and not follower.ended_with_newline:
                follower.emit(b"\n")
            return row
        await anyio.sleep(TAIL_POLL_S)
        fresh = await store.get_job(job_id, with_output=False)
        if fresh is None:  # purged under us
            follower.clear_waiting()
            return row
        row = fresh
