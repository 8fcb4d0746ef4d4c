"""`config show`: the effective configuration, each value with the source that set it.

Like `git config --list --show-origin`: the defaults, the file, the secret files and the
environment merged exactly as the gateway merges them (gateway/config/__init__.py
`load_planned`), printed as TOML with the source beside each value as a comment (`--json`: one object per
key). Secrets are printed as the redaction marker, never their value: every key the
config's own rule calls secret (gateway/config/errors.py `is_secret_path`), and any
password or bearer credential written inside another value (gateway/logs.py).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_OK
from gateway.config import load_planned, origin_label, source_plan
from gateway.config.errors import is_secret_path
from neutral.redaction import REDACTED, redact_value

# (key path, value as printed, source)
Entry = tuple[tuple[str, ...], Any, str]

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
SOURCE_COLUMN = 48  # where the source comments start, unless a line is longer


def add_parsers(tree: CommandTree) -> None:
    """`config show [--json]`."""
    config = tree.add("config", help="the effective configuration and where each value is from")
    actions = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", parents=[tree.common], help="print the effective configuration with its sources",
        description="Print the configuration the gateway would run with: the defaults, the "
                    "config file, the secret files ($AGENT_GATEWAY_SECRETS_DIR) and the "
                    "AGENT_GATEWAY_* variables merged, as TOML with each value's source "
                    "beside it. Secrets are shown as " + REDACTED + ".")
    show.add_argument("--json", action="store_true",
                      help="a JSON array, one {key, value, source} object per key")
    show.set_defaults(handler=cmd_config_show)


def cmd_config_show(args: argparse.Namespace) -> int:
    plan = source_plan(args.config)
    settings = load_planned(plan)
    values = settings.model_dump(mode="json", by_alias=True)
    entries = [(path, value, origin_label(plan, path)) for path, value in _leaves(values, ())]
    if args.json:
        print(json.dumps([{"key": ".".join(path), "value": value, "source": source}
                          for path, value, source in entries], indent=2))
    else:
        print(render_toml(entries), end="")
    return EXIT_OK


def _leaves(node: dict[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Every key below `node` with its redacted value; an empty table is a value."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for key, value in node.items():
        here = (*path, key)
        if isinstance(value, dict) and value:
            found += _leaves(value, here)
        elif value is not None and value != {} and is_secret_path(here):
            found.append((here, REDACTED))
        else:
            found.append((here, redact_value(value)))
    return found


def render_toml(entries: list[Entry]) -> str:
    """The entries as a TOML document (it parses, and loads as the same settings apart from
    the redacted values), a `# source` comment on each line; an unset key is a comment."""
    import tomli_w  # deferred: start-up (only this command writes TOML)

    lines = ["# The effective configuration; beside each value, its source (strongest "
             "first: env, secret file, file, default)."]
    tables: dict[tuple[str, ...], list[Entry]] = {}
    for entry in entries:
        tables.setdefault(entry[0][:-1], []).append(entry)
    for table, rows in sorted(tables.items(), key=lambda item: _table_order(item[0], entries)):
        if table:
            lines += ["", f"[{'.'.join(_key(part) for part in table)}]"]
        for path, value, source in rows:
            key = _key(path[-1])
            if value is None:
                text = f"# {key} is unset"
            elif value == {}:
                text = f"{key} = {{}}"
            else:
                text = tomli_w.dumps({path[-1]: value}).rstrip("\n")
            lines.append(f"{text.ljust(SOURCE_COLUMN)}  # {source}")
    return "\n".join(lines) + "\n"


def _table_order(table: tuple[str, ...], entries: list[Entry]) -> tuple[int, int]:
    """Tables in the order their first key comes (the model's), each before its sub-tables,
    the top level first: a key above every header belongs to no table."""
    first = next(i for i, (path, _, _) in enumerate(entries) if path[:len(table)] == table)
    return first, len(table)


def _key(part: str) -> str:
    """A TOML key: bare when it can be, else quoted (JSON's escapes are TOML's)."""
    return part if BARE_KEY.fullmatch(part) else json.dumps(part)
