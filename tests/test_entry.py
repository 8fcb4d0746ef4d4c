"""gateway/entry.py: the collector is paused while the process starts, and always resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway import __version__
from tests.waiting import scaled

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a process of its own: a paused or frozen collector is the process's."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=scaled(60), check=False)


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


def test_version_answers_without_the_parser_or_the_config(tmp_path: Path) -> None:
    """`--version` is a launcher's probe (#45: under 100 ms): it prints what argparse would
    and imports neither the CLI's parser nor pydantic and the config."""
    code = ("import sys\n"
            "sys.argv = ['agent-cli-gateway', '--version']\n"
            "from gateway.entry import main\n"
            "code = main()\n"
            "heavy = sorted(m for m in ('pydantic', 'gateway.config', 'gateway.cli.main',\n"
            "                           'structlog', 'anyio') if m in sys.modules)\n"
            "print('heavy', heavy, code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=scaled(60), check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == f"agent-cli-gateway {__version__}"
    assert second == "heavy [] 0"
