"""Input safety for CLI invocations: nothing a caller sends may become a flag or break exec.

Every adapter runs `check_request` before it builds an argv, and `check_argv_size` on the
argv it built. Both raise InvalidRequest with a message that says what to change; the job
layer reports it as `error_kind="invalid_input"` without spawning anything.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel

from providers.base import InvalidRequest, ProviderRequest

# Linux refuses any single argv/env string longer than MAX_ARG_STRLEN (32 pages) with E2BIG,
# whatever ARG_MAX says. Other systems have no per-string cap, but the same cap everywhere keeps
# one rule (and no OS branch outside gateway/platform): a prompt that long belongs on stdin or
# in a file anyway.
MAX_ARG_STRLEN = 32 * 4096
# Room kept free inside ARG_MAX for the child's environment when the caller does not pass it
# (the gateway adds PATH/NO_COLOR/TERM and the provider's config env to what it inherits).
ENV_MARGIN_BYTES = 64 * 1024
# What ARG_MAX is taken to be when sysconf cannot tell (POSIX guarantees at least 4096;
# every system we run on has far more, so this only matters on exotic platforms).
FALLBACK_ARG_MAX = 256 * 1024
POINTER_BYTES = 8  # each argv/envp entry also costs one pointer in the exec block
# Characters skipped before the leading-dash check: controls, format characters (zero-width
# space, BOM) and separators render as nothing, and trimming code often removes them.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def reject_nul(what: str, value: str | None) -> None:
    """A NUL byte ends a C string: the CLI would silently see a truncated value."""
    if value is not None and "\x00" in value:
        raise InvalidRequest(f"{what} contains a NUL byte (\\x00); remove it and retry.")


def _first_visible(value: str) -> str:
    """The first character once whitespace and invisible format characters are skipped.

    Adapters strip some values before use (the model), and a CLI may trim what it gets (a
    JavaScript `trim()` also drops U+FEFF): "  --yolo" must be judged as "--yolo".
    """
    for char in value:
        if not char.isspace() and unicodedata.category(char) not in INVISIBLE_CATEGORIES:
            return char
    return ""


def reject_flag_like(what: str, value: str | None) -> None:
    """A value that starts with '-', after any leading whitespace, could be parsed as an
    option by the CLI."""
    if value is not None and _first_visible(value) == "-":
        raise InvalidRequest(
            f"{what} {value!r} starts with '-' (leading whitespace does not count), so the "
            f"CLI could read it as an option; pass a value that does not start with '-'."
        )


def _option_values(options: BaseModel | None) -> Iterable[tuple[str, object]]:
    if options is None:
        return ()
    return ((name, getattr(options, name)) for name in type(options).model_fields)


def check_request(request: ProviderRequest) -> None:
    """Reject a request that could not be passed to a CLI safely.

    Raises InvalidRequest when the prompt is empty, when any text contains a NUL byte, or
    when a session id, a model name or any list value starts with '-'.
    """
    if not request.prompt or not request.prompt.strip():
        raise InvalidRequest("prompt is empty; send the task text in `prompt`.")
    reject_nul("prompt", request.prompt)
    reject_nul("model", request.model)
    reject_flag_like("model", request.model)
    reject_nul("working_dir", request.working_dir)
    reject_nul("session_id", request.session_id)
    if request.session_id is not None:
        if not request.session_id.strip():
            raise InvalidRequest("session_id is blank; omit it to start a new session.")
        reject_flag_like("session_id", request.session_id)
    for name, value in _option_values(request.options):
        if isinstance(value, str):
            reject_nul(f"options.{name}", value)
        elif isinstance(value, Sequence):
            for item in value:
                if isinstance(item, str):
                    reject_nul(f"options.{name} item", item)
                    reject_flag_like(f"options.{name} item", item)


def arg_max() -> int:
    """The kernel's limit on argv + envp bytes for exec (SC_ARG_MAX)."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_ARG_MAX
    return value if value > 0 else FALLBACK_ARG_MAX


def _block_bytes(strings: Iterable[str]) -> int:
    return sum(len(s.encode("utf-8", "surrogateescape")) + 1 + POINTER_BYTES for s in strings)


def check_argv_size(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Reject an argv that exec would refuse with E2BIG ("Argument list too long").

    The budget is SC_ARG_MAX minus the child's environment: `env` when given (the full
    environment the child will get), else this process's environment plus ENV_MARGIN_BYTES.
    Each single element is also capped at MAX_ARG_STRLEN (128 KiB, Linux's per-string cap).
    Raises InvalidRequest saying how big the request is and what the limit is.
    """
    for element in argv:
        size = len(element.encode("utf-8", "surrogateescape"))
        if size >= MAX_ARG_STRLEN:
            raise InvalidRequest(
                f"one command-line argument is {size} bytes; at most {MAX_ARG_STRLEN - 1} "
                f"bytes per argument are accepted. Shorten the prompt (or put long material "
                f"in a file in working_dir and refer to it)."
            )
    if env is None:
        env_bytes = _block_bytes(f"{k}={v}" for k, v in os.environ.items()) + ENV_MARGIN_BYTES
    else:
        env_bytes = _block_bytes(f"{k}={v}" for k, v in env.items())
    budget = arg_max() - env_bytes
    total = _block_bytes(argv)
    if total > budget:
        raise InvalidRequest(
            f"the command line would be {total} bytes but only {max(budget, 0)} are available "
            f"(ARG_MAX {arg_max()} minus the environment). Shorten the prompt (or put long "
            f"material in a file in working_dir and refer to it)."
        )
