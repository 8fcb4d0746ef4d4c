"""What the command modules' parsers share: the tree they add to, its parser class and the
argument types.

main.build_parser makes the tree and calls each command module's `add_parsers(tree)` in the
order `--help` lists the commands, so a command's flags live beside its handler and a new
command is one module plus one entry in main.py's COMMAND_MODULES.
"""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    # argparse's subparsers action: its class is not subscriptable at run time.
    Subcommands = argparse._SubParsersAction["Parser"]

INVALID_CHOICE = re.compile(r"invalid choice: '(?P<typed>[^']*)' \(choose from (?P<choices>.*)\)")


COMMAND_PREFIXES = ("argument COMMAND: ", "argument ACTION: ")  # the metavars below
SUGGEST_CUTOFF = 0.5  # difflib ratio: 'lsit' -> 'list' (0.5), 'claud' -> 'claude'


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped command (`jobs lst`), as git and gh
    have; subparsers are built from the same class, so every level gets it."""

    def error(self, message: str) -> NoReturn:
        found = INVALID_CHOICE.search(message)
        if found:
            typed = found.group("typed")
            choices = re.findall(r"'([^']*)'", found.group("choices"))
            close = difflib.get_close_matches(typed, choices, n=1, cutoff=SUGGEST_CUTOFF)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            prefix = message[:found.start()]
            what = ("unknown command" if prefix in COMMAND_PREFIXES
                    else f"{prefix}invalid choice")
            message = f"{what} '{typed}'{hint}; choose from {', '.join(choices)}"
        super().error(message)


@dataclass(slots=True)
class CommandTree:
    """The command line being built. `commands`: the top level (`serve`, `run`, `jobs` ...);
    `common`: `--config` and `--debug`, a parent of every command so that they work after
    the command name too."""

    commands: Subcommands
    common: Parser
    _jobs: Subcommands | None = None

    def add(self, name: str, **kwargs: Any) -> Parser:
        """A top-level command, with the common flags."""
        return self.commands.add_parser(name, parents=[self.common], **kwargs)

    def add_job_action(self, name: str, **kwargs: Any) -> Parser:
        """An action of `jobs` (jobs.py: list, show ...; worktrees.py: diff, apply, discard).
        The `jobs` group is made on first use, so `--help` lists it where its first
        module's commands are."""
        if self._jobs is None:
            jobs = self.add("jobs", help="inspect, follow and cancel jobs",
                            description="A job id may be given as any unique prefix.")
            self._jobs = jobs.add_subparsers(dest="jobs_command", metavar="ACTION",
                                             required=True)
        return self._jobs.add_parser(name, parents=[self.common], **kwargs)


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError("must be between 0 and 65535")
    return value
