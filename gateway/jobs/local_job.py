"""A job this instance drives: what the manager, its driver and its reads share about it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.jobs.execution import Execution
from gateway.jobs.limiter import Ticket
from gateway.jobs.targets import Target
from gateway.model import ErrorKind, JobRow


@dataclass(eq=False)
class LocalJob:
    """A job this instance owns and drives."""

    row: JobRow
    target: Target
    ticket: Ticket
    spool_dir: Path
    timeout_s: float
    execution: Execution | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_reason: ErrorKind | None = None
    started_mono: float = field(default_factory=time.monotonic)
    adopted: bool = False  # started by a gateway that is gone; watched and finalized here
    # Its row is terminal by our write, so its spool goes once `done` is set (drive.py).
    spool_settled: bool = False
    # That terminal row as our write left it (light): a waiter woken by `done` answers from
    # it instead of reading it back (reads.py).
    terminal: JobRow | None = None

    @property
    def output_bytes(self) -> int:
        return self.execution.stdout_bytes if self.execution else 0
