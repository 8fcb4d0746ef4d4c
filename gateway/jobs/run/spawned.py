"""A supervisor just started by the runner's spawn thread, before the event loop watches it:
what is known of it, and how it is disposed of when nothing will ever watch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from dataclasses import dataclass

from gateway import proc
from gateway.platform import ExitWatch


@dataclass(slots=True)
class Spawned:
    """A supervisor just started by the spawn thread, not yet watched by the event loop."""

    popen: subprocess.Popen[bytes]
    exit_watch: ExitWatch | None
    started_at: float
    executable: str


def close_watch(watch: ExitWatch | None) -> None:
    if watch is not None:
        watch.close()


def priority_targets(increment: int) -> tuple[int, int | None]:
    """The nice value of a run, `increment` levels below the gateway, and of its autogroup
    (None: no autogroup scheduling)."""
    nice = min(proc.MAX_NICE, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    own = proc.autogroup_nice(os.getpid())
    autogroup = None if own is None else min(proc.MAX_NICE, own + increment)
    return nice, autogroup


def reap_when_spawned(spawning: asyncio.Future[Spawned]) -> None:
    """A supervisor spawned for a run that was detached meanwhile: wait for its exit in a
    daemon thread (nobody else will), without touching the run."""
    if spawning.cancelled() or spawning.exception() is not None:
        return
    spawned = spawning.result()
    close_watch(spawned.exit_watch)

    def reap() -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(spawned.popen.pid, 0)
        spawned.popen.returncode = 0  # collected: its finalizer must not wait again

    threading.Thread(target=reap, name=f"reap-{spawned.popen.pid}", daemon=True).start()
