"""gateway/entry.py: the collector is paused while the process starts, and always resumes."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a process of its own: a paused or frozen collector is the process's."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_startup_pause_ends_by_itself_with_what_the_start_made_frozen() -> None:
    done = run_python(
        "import gc, gateway.entry as e; t = e.pause_gc_for_startup(0.05); "
        "paused = not gc.isenabled(); kept = [[] for _ in range(1000)]; t.join(10); "
        "print(paused, t.daemon, gc.isenabled(), gc.get_freeze_count() >= len(kept))")
    # paused, never keeps a finished command alive, resumed, and the start's objects frozen
    assert (done.returncode, done.stdout.split()) == (0, ["True"] * 4), done.stderr


def test_the_console_entry_runs_a_command_with_the_pause_in_force() -> None:
    done = run_python("import gc, gateway.entry as e; "
                      "import gateway.cli.main as m; m.main = lambda: print(gc.isenabled()) or 0; "
                      "raise SystemExit(e.main())")
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
