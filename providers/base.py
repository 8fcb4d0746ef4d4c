"""The adapter interface every provider module implements.

A provider is data plus two small functions: `build_invocation` (request -> argv/env/stdin)
and `parse_stream` (stdout -> ProviderResult; `parse_output` is the same over bytes). It knows
nothing about jobs, stores or MCP.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict

from providers.figures import Usage
from providers.parsing import Stdout, decode, plain_text, strip_ansi, tail


class OutputDiscipline(StrEnum):
    STREAMS = "streams"  # prints as it works: an idle timeout is meaningful
    AT_EXIT = "at_exit"  # prints nothing until it exits: never idle-killed


class InvalidRequest(ValueError):
    """The request cannot be turned into a safe invocation (message says what to change)."""


def _absolute(path: str) -> str:
    # A relative directory would be resolved against whatever cwd the CLI runs in (a temp
    # dir, or working_dir): never what the caller meant to grant (#23 item 9).
    if not os.path.isabs(path):
        raise ValueError(f"must be an absolute path (got a relative one of {len(path)} "
                         f"characters)")
    return path


# A directory an option grants the agent (add_dirs): absolute, or refused.
AbsolutePath = Annotated[str, AfterValidator(_absolute)]


class ProviderOptions(BaseModel):
    """Provider-specific options (permission mode, output format...). Subclass per provider.

    Field descriptions become the MCP tool's input schema, so write them for an agent.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """A validated request, common fields plus the provider's own options."""

    prompt: str
    model: str | None = None
    working_dir: str | None = None
    session_id: str | None = None  # the native session to resume (None: a fresh one)
    options: ProviderOptions | None = None
    # The most this run may cost (USD): the caller's max_cost_usd or a budget's reservation,
    # passed to a CLI that can stop itself at it (claude --max-budget-usd, vibe --max-price).
    max_cost_usd: float | None = None


@dataclass(slots=True)
class Invocation:
    """How to run one request. argv[0] is the command as configured (not yet resolved)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the child's environment
    stdin: bytes | None = None  # written then closed; None means stdin is /dev/null


@dataclass(slots=True)
class ProviderResult:
    text: str
    session_id: str | None = None  # the native session id the CLI reported
    usage: Usage | None = None
    is_error: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # model, num_turns, stop_reason...
    # True: the answer is stdout itself as plain text (ANSI codes removed, blank ends
    # trimmed), and `text` is left empty for the caller, who holds stdout, to resolve:
    # parse_output does from its bytes; the gateway stores where in the output the answer
    # is instead of a second copy of an output that can be max_output_bytes.
    answer_is_stdout: bool = False


@dataclass(frozen=True, slots=True)
class LoginCheck:
    """What `doctor` may look at to learn whether a CLI is logged in without spending
    anything (gateway/cli/doctor_auth.py), in this order: an offline status command, the
    credential files it keeps, an API key it would be passed. All empty: the CLI has no
    offline check, and doctor says "cannot tell" (an adapter sets that explicitly)."""

    status_argv: tuple[str, ...] = ()  # an offline status subcommand: exit 0 = logged in
    status_exit_1_is_no: bool = False  # its exit 1 is documented as "not logged in"
    files: tuple[str, ...] = ()  # credential files (`~`, `$CODEX_HOME` expanded); present = yes
    env_keys: tuple[str, ...] = ()  # an API key in one of these also authenticates it
    in_macos_keychain: bool = False  # on macOS the login is kept in the keychain instead


class CliProvider:
    """Base class of the seven CLI adapters. Subclasses set the class attributes and
    implement `build_invocation` and `parse_stream`. Every attribute declared here without
    a value is one of the provider's facts: each adapter must set it (a test fails when
    one does not, instead of doctor or the budgets quietly guessing)."""

    name: ClassVar[str]
    commands: ClassVar[tuple[str, ...]]  # binaries to look for, preferred first
    discipline: ClassVar[OutputDiscipline]
    login_hint: ClassVar[str]  # "Run `codex login` and retry."
    install_hint: ClassVar[str]  # "npm install -g @openai/codex"
    options_model: ClassVar[type[ProviderOptions]] = ProviderOptions
    known_models: ClassVar[tuple[str, ...]] = ()
    auth_failure: ClassVar[re.Pattern[str]]  # the CLI's not-logged-in wording
    login_check: ClassVar[LoginCheck]  # checked against docs/providers.md and the CLI's help
    # Whether the CLI prints what a run cost (and can stop itself at a cap): only these count
    # against a money budget; the others count by job (docs/configuration.md, [budgets]).
    reports_cost: ClassVar[bool]

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        raise NotImplementedError

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        """The run's result, read from stdout in bounded passes (it can be a file of
        limits.max_output_bytes). A plain-text answer comes back as `answer_is_stdout`."""
        raise NotImplementedError

    def auth_error_in(self, stdout: Stdout, stderr: bytes, exit_code: int | None) -> bool:
        """True when the run says the CLI is not logged in: a failed run whose output ends
        in the CLI's not-logged-in wording (`auth_failure`). A CLI that also reports it in
        its own events (an exit code, an error event) adds that in an override."""
        return failed(exit_code) and matches_auth_failure(self.auth_failure, stdout, stderr)

    def parse_output(self, stdout: bytes, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        """parse_stream over stdout held in memory, with a plain-text answer filled in."""
        result = self.parse_stream(Stdout(stdout), stderr, exit_code, options)
        if result.answer_is_stdout:
            result.text, result.answer_is_stdout = plain_text(stdout), False
        return result

    def is_auth_error(self, stdout: bytes | Stdout, stderr: bytes, exit_code: int | None) -> bool:
        return self.auth_error_in(Stdout.of(stdout), stderr, exit_code)

    def output_discipline(self, options: ProviderOptions | None = None) -> OutputDiscipline:
        """The discipline of a run with these options. Defaults to the class's `discipline`;
        a provider whose output-format option decides whether it prints while working
        (claude `json`/`text` print only at exit) overrides this."""
        return self.discipline



def failed(exit_code: int | None) -> bool:
    """A run that ended with a non-zero exit code (None: killed or unknown, not a failure
    the CLI reported itself)."""
    return exit_code is not None and exit_code != 0


def matches_auth_failure(pattern: re.Pattern[str], stdout: Stdout, stderr: bytes) -> bool:
    """True when the end of stdout or stderr matches the CLI's not-logged-in wording."""
    text = stdout.tail() + "\n" + tail(strip_ansi(decode(stderr)))
    return pattern.search(text) is not None
