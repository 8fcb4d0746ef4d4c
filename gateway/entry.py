"""The console entry (`agent-cli-gateway`, `python -m gateway`): the cyclic garbage
collector paused while the process starts.

A gateway's start is imports (the MCP SDK's and pydantic's models, the config's) and the
first tool schemas: millions of allocations and next to no garbage, yet the collector runs
its young-generation passes over them all the while. Paused, the start to the first
`tools/list` answer is about 60 ms (a tenth) shorter on a 2-core box (bench/README.md,
startup). Reference counting frees everything as usual meanwhile; only cycles wait, and
they are few and small at start. The pause ends after STARTUP_GC_PAUSE_S whatever the
command is doing (a long `jobs tail -f` collects as usual from then on).
"""

from __future__ import annotations

import gc
import threading

STARTUP_GC_PAUSE_S = 5.0


def pause_gc_for_startup(seconds: float = STARTUP_GC_PAUSE_S) -> threading.Timer:
    """Disable the cyclic collector now and enable it again after `seconds` (a daemon
    timer: it never keeps the process alive)."""
    gc.disable()
    timer = threading.Timer(seconds, gc.enable)
    timer.daemon = True
    timer.name = "gc-resume"
    timer.start()
    return timer


def main() -> int:
    pause_gc_for_startup()
    from gateway.cli.main import main as run_command

    return run_command()
