"""What a configuration error may say: the one readable line per problem, naming its source.

`ConfigError` is what every loader raises instead of a pydantic (or pydantic-settings)
traceback; `describe` turns one pydantic error into that line. A value that came from an
environment variable or a secret file is never quoted (#38 item 8: a token pasted into
`AGENT_GATEWAY_HTTP__PORT` was printed by `doctor`, logged and answered over MCP); one from
the file only when `may_echo` allows (never under a secret key, never a long value). Keys
are compared in ASCII only. This module knows no config model: gateway/config/__init__.py
holds the models and the loading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neutral.redaction import is_secret_key

# A value longer than this is never quoted in an error (it may be a pasted secret or a
# megabyte of junk); shorter ones are, unless their key holds secrets (`may_echo`).
MAX_ECHOED_CHARS = 40
# Keys whose values are secrets, or may hold them: never quoted in an error, redacted by
# `config show`.
SECRET_KEY_PARTS = frozenset({"env", "headers", "auth_token", "dsn"})


class ConfigError(Exception):
    """The configuration is invalid. `problems` holds one readable line per problem;
    `env_names` the environment variables at fault, `secret_files` the secret files at
    fault and `in_file` whether the file is too, so every message can name the source that
    is wrong (`source`)."""

    def __init__(self, path: Path | None, problems: list[str],
                 env_names: list[str] | None = None, *, in_file: bool | None = None,
                 secret_files: list[str] | None = None) -> None:
        self.path = path
        self.problems = problems
        self.env_names = sorted(set(env_names or []))
        self.secret_files = sorted(set(secret_files or []))
        self.in_file = path is not None if in_file is None else in_file
        super().__init__(f"invalid configuration in {self.where}:\n"
                         + "\n".join(f"  - {p}" for p in problems))

    def _parts(self, *, long: bool) -> list[str]:
        parts = []
        if self.in_file and self.path:
            parts.append(f"the config file {self.path}" if long else str(self.path))
        if self.env_names:
            noun = "variable" if len(self.env_names) == 1 else "variables"
            text = f"the environment {noun} {', '.join(self.env_names)}"
            if long:
                text += (" (set in the MCP client's env block or the shell that started the "
                         "gateway)")
            parts.append(text)
        if self.secret_files:
            noun = "file" if len(self.secret_files) == 1 else "files"
            parts.append(f"the secret {noun} {', '.join(self.secret_files)}")
        return parts

    @property
    def where(self) -> str:
        """The file's path and/or the variables' names: the short form, for the header."""
        return " and ".join(self._parts(long=False)) or "the configuration"

    @property
    def source(self) -> str:
        """The source that is wrong, in words: `the config file P`, `the environment
        variable X` (set in the MCP client's env block or the shell), or both."""
        return " and ".join(self._parts(long=True)) or "the configuration"


# -- keys: compared in ASCII only -----------------------------------------------------------


def ascii_lower(text: str) -> str:
    """Lower-case A-Z only. `str.lower` folds the Kelvin sign (U+212A) to `k`, which would
    let a look-alike key name a real one; a non-ASCII letter stays and names no key."""
    return text.translate(_ASCII_LOWER)


def ascii_upper(text: str) -> str:
    """Upper-case a-z only (see ascii_lower)."""
    return text.translate(_ASCII_UPPER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


# -- values: what an error (or `config show`) may quote -------------------------------------


def is_secret_path(parts: tuple[str, ...] | list[str]) -> bool:
    """Whether a key path holds a secret: a CLI's `env`, HTTP `headers`, `auth_token`,
    `dsn`, or a key the one secret-name rule names (neutral/redaction.py: `*_token`,
    `*_password`, `*_api_key`, ...; `api_key_env` holds a variable's name, no secret)."""
    return any(part in SECRET_KEY_PARTS or is_secret_key(ascii_lower(part)) for part in parts)


def may_echo(parts: list[str], value: Any) -> bool:
    """Whether an error may quote this value: not under a key that holds secrets, not a
    table, and short."""
    if value is None or isinstance(value, dict) or is_secret_path(parts):
        return False
    return len(repr(value)) <= MAX_ECHOED_CHARS


# -- one pydantic error as one line ----------------------------------------------------------

@dataclass(frozen=True)
class Origin:
    """Where a key's value came from, other than the file: `env` and the variable's name,
    or `secret file` and the file's path."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


ENV = "env"
SECRET_FILE = "secret file"
# The source that set a key path, or None: then the key came from the file (or a default).
OriginOf = Callable[[tuple[str, ...]], Origin | None]
# Said instead of a value from a variable or a secret file, so nobody looks for a missing one.
NOT_SHOWN = "its value is never shown"


def describe(err: Mapping[str, Any], origin_of: OriginOf) -> tuple[str, Origin | None]:
    """One problem as a line naming its key, what the key expects (pydantic's message) and
    the variable or secret file that set it, and that source. The value is quoted only
    when it came from the file and `may_echo` allows: a variable's or a secret file's value
    may be a secret typed into the wrong name, so it is never shown. pydantic's own
    messages never hold the input, and the config's validators quote none that failed (the
    lease rules name numbers that passed as numbers)."""
    parts = [str(p) for p in err.get("loc", ()) if p not in ("function-after",)]
    loc = ".".join(parts)
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    origin = origin_of(tuple(parts)) if parts else None
    if err.get("type") == "extra_forbidden":
        source = f" (set by {origin})" if origin else ""
        return (f"unknown key '{loc}'{source} (check the spelling; see config.example.toml "
                "for every key)"), origin
    value = err.get("input")
    if origin is None:
        shown, source = (f" (got {value!r})" if may_echo(parts, value) else ""), ""
    elif isinstance(value, dict):  # a rule between keys: it names the numbers it compares
        shown, source = "", f" (set by {origin})"
    else:
        shown, source = "", f" (set by {origin}; {NOT_SHOWN})"
    if not loc or msg.startswith(loc.split(".")[0]):
        return f"{msg}{shown}{source}", origin
    return f"{loc}: {msg}{shown}{source}", origin

