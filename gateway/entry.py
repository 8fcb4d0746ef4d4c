"""The console entry (`agent-cli-gateway`, `python -m gateway`): the cyclic garbage
collector paused while the process starts.

A gateway's start is imports (the MCP SDK's and pydantic's models, the config's) and the
first tool schemas: millions of allocations and next to no garbage, yet the collector runs
its young-generation passes over them all the while. Paused, the start to the first
`tools/list` answer is about 60 ms (a tenth) shorter on a 2-core box (bench/README.md,
startup). Reference counting frees everything as usual meanwhile; only cycles wait, and
they are few and small at start. The pause ends after STARTUP_GC_PAUSE_S whatever the
command is doing (a long `jobs tail -f` collects as usual from then on).

What exists when the pause ends is frozen first (gc.freeze): the modules, models, schemas
and settings a gateway keeps for its life. Without that, the first collections after the
pause walked every one of them (about 150,000 tracked objects, some 40 ms of CPU on a 2-core box,
and its event loop stalled meanwhile), and every later full collection again. The few
cycles of the start that were garbage stay, once.
"""

from __future__ import annotations

import gc
import sys
import threading

from gateway.cli.version import print_version

STARTUP_GC_PAUSE_S = 5.0


def pause_gc_for_startup(seconds: float = STARTUP_GC_PAUSE_S) -> threading.Timer:
    """Disable the cyclic collector now and enable it again after `seconds` (a daemon
    timer: it never keeps the process alive)."""
    gc.disable()
    timer = threading.Timer(seconds, _resume_gc)
    timer.daemon = True
    timer.name = "gc-resume"
    timer.start()
    return timer


def _resume_gc() -> None:
    gc.freeze()  # never scanned again: what a process keeps for its life (above)
    gc.enable()


def main() -> int:
    if sys.argv[1:] == ["--version"]:  # a probe: answered without the parser's imports
        return print_version()
    pause_gc_for_startup()
    # After the pause: the collector stays out of the CLI's imports.
    from gateway.cli.main import main as run_command  # deferred: start-up

    return run_command()
