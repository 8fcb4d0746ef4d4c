"""`agent-cli-gateway --version`, answered before the parser exists.

A launcher's or a client's probe (uvx, a setup check) wants one line at once; the parser
imports pydantic and the config first (~0.2 s on a quiet 2-core box, seconds under load).
The line is the one argparse's `--version` prints (gateway/cli/main.py).
"""

from __future__ import annotations

from gateway import __version__

PROG = "agent-cli-gateway"  # the program's name in every message and hint (common.py re-uses it)


def version_line() -> str:
    return f"{PROG} {__version__}"


def print_version() -> int:
    print(version_line())
    return 0
