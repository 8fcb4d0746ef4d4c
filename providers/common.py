"""What the seven CLI adapters share: model choice, option coercion, auth-text matching.

Each adapter stays a short description of its own CLI; anything two of them would copy
lives here.
"""

from __future__ import annotations

from typing import TypeVar

from providers.base import (
    InvalidRequest,
    Invocation,
    ProviderOptions,
    ProviderRequest,
    ProviderResult,
    failed,
)
from providers.safety import (
    check_argv_size,
    check_request,
    reject_flag_like,
    reject_nul,
)

# Model names that mean "whatever the gateway (or else the CLI) uses by default".
DEFAULT_MODEL_ALIASES = frozenset({"default", "latest"})

OptionsT = TypeVar("OptionsT", bound=ProviderOptions)


def options_as(model: type[OptionsT], options: ProviderOptions | None) -> OptionsT:
    """The request's options as this provider's options model (defaults when absent).

    Accepts an instance of another ProviderOptions subclass by re-validating its fields, so
    a caller that built the base class still gets a clear error for a wrong field.
    """
    if options is None:
        return model()
    if isinstance(options, model):
        return options
    try:
        return model.model_validate(options.model_dump(exclude_unset=True))
    except ValueError as exc:
        raise InvalidRequest(f"invalid options for this provider: {exc}") from None


def effective_model(request: ProviderRequest, default_model: str | None) -> str | None:
    """The model to pass: the request's, else the configured default, else None (CLI's own).

    "default" and "latest" select the configured default.
    """
    model = request.model
    if model is None or not model.strip() or model.strip().lower() in DEFAULT_MODEL_ALIASES:
        model = default_model
    if model is None or not model.strip() or model.strip().lower() in DEFAULT_MODEL_ALIASES:
        return None
    reject_nul("model", model)
    reject_flag_like("model", model)
    return model.strip()


def start_checks(request: ProviderRequest, extra_args: list[str] | None) -> list[str]:
    """Validate the request (check_request) and return the config's extra args as a list."""
    check_request(request)
    extra = list(extra_args or [])
    for arg in extra:
        reject_nul("a configured extra_args item", arg)
    return extra


# A CLI that reads its prompt from a file (`--prompt-file`) is given this path with the
# prompt on stdin: the prompt stays out of argv (`ps` shows argv to every local user) and
# never touches the disk. Linux and macOS both have /dev/stdin.
PROMPT_FROM_STDIN = "/dev/stdin"


def finish(argv: list[str], env: dict[str, str] | None = None,
           stdin: bytes | None = None) -> Invocation:
    """The Invocation, after checking the argv fits the kernel's exec limits."""
    check_argv_size(argv)
    return Invocation(argv=argv, env=dict(env or {}), stdin=stdin)


def stdout_answer(exit_code: int | None) -> ProviderResult:
    """A run whose answer is its stdout as plain text (see ProviderResult.answer_is_stdout)."""
    return ProviderResult(text="", is_error=failed(exit_code), answer_is_stdout=True)


def usd_arg(amount: float) -> str:
    """A dollar amount as a CLI flag value: plain decimal, never an exponent ("1e-07")."""
    return f"{amount:.6f}".rstrip("0").rstrip(".") or "0"
