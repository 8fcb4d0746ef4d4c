"""gateway/entry.py: the collector is paused while the process starts, and always resumes."""

from __future__ import annotations

import gc
import subprocess
import sys
import time

from gateway.entry import pause_gc_for_startup


def test_the_startup_pause_ends_by_itself() -> None:
    assert gc.isenabled()
    try:
        timer = pause_gc_for_startup(0.05)
        assert not gc.isenabled()
        assert timer.daemon  # never keeps a finished command alive
        deadline = time.monotonic() + 10
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_the_console_entry_runs_a_command_with_the_pause_in_force() -> None:
    code = ("import gc, gateway.entry as e; "
            "import gateway.cli.main as m; m.main = lambda: print(gc.isenabled()) or 0; "
            "raise SystemExit(e.main())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
