"""`finalize SPOOL_DIR`: write the terminal row of a run whose gateway is gone.

Not for people: a supervisor starts it when its run ended and the gateway that launched
the run is gone (gateway/jobs/finalizer.py says why and how), its settings on stdin (they
may hold a DSN password: never argv, never a file). Run by hand without stdin it reads the
config as every other command does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_FAILURE, EXIT_OK, load, run
from gateway.logs import configure_logging


def add_parsers(tree: CommandTree) -> None:
    """`finalize SPOOL_DIR`: not for people (hidden from --help)."""
    finalize = tree.add(
        "finalize", help=argparse.SUPPRESS,
        description="Write the terminal row of a run that ended while its gateway was gone "
                    "(a supervisor starts this, its settings on stdin).")
    finalize.add_argument("spool_dir", metavar="SPOOL_DIR", help="the run's spool directory")
    finalize.set_defaults(handler=cmd_finalize)


def cmd_finalize(args: argparse.Namespace) -> int:
    # The job machinery: only this command loads it.
    from gateway.jobs.finalizer import finalize_run, settings_from_handoff  # deferred: start-up

    handed = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if handed.strip():
        settings = settings_from_handoff(handed)
        configure_logging(settings.logging.level, settings.logging.format)
    else:
        settings = load(args, quiet=True)
    outcome = run(finalize_run, settings, Path(args.spool_dir))
    print(f"finalize {args.spool_dir}: {outcome}", file=sys.stderr)
    return EXIT_OK if outcome in ("finalized", "already settled") else EXIT_FAILURE
