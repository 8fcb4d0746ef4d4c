"""A supervisor just forked for a run, before the runner watches it: what is known of it,
and how its exit is learned meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway import proc
from gateway.jobs.run.forks import Link


@dataclass(slots=True)
class Spawned:
    """A supervisor just forked, not yet watched by the event loop. `link`: the zygote that
    forked it and reports its exit; None when that zygote is gone (then its pid is polled)."""

    pid: int
    link: Link | None
    started_at: float
    executable: str

    @classmethod
    def from_claim(cls, claim: dict[str, Any], executable: str) -> Spawned:
        """The supervisor that won a run's claim (`start.json`), forked by a zygote that is
        gone: its exit is polled."""
        return cls(pid=int(claim["pid"]), link=None, started_at=float(claim["started_at"]),
                   executable=executable)

    def exited(self) -> bool:
        """Whether it is known to have exited."""
        if self.link is not None and self.link.alive:
            return self.link.has_exited(self.pid)
        return not proc.is_process_alive(self.pid, self.started_at)

    def on_exit(self, callback: Callable[[int | None], None]) -> None:
        """`callback` once it has exited (its returncode, None: unknown); at once when its
        zygote is gone (the caller has SIGKILLed its group)."""
        if self.link is None:
            callback(None)
        else:
            self.link.watch(self.pid, callback)


def priority_targets(increment: int) -> tuple[int, int | None]:
    """The nice value of a run, `increment` levels below the gateway, and of its autogroup
    (None: no autogroup scheduling)."""
    nice = min(proc.MAX_NICE, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    own = proc.autogroup_nice(os.getpid())
    autogroup = None if own is None else min(proc.MAX_NICE, own + increment)
    return nice, autogroup
