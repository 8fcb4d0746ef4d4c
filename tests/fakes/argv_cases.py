"""Every option combination of every adapter, shared by the argv golden tests, the fake-CLI
tests and the real-CLI tests (so all three check the same invocations)."""

from __future__ import annotations

import itertools
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from providers.base import CliProvider, ProviderOptions, ProviderRequest
from providers.registry import CLI_PROVIDERS

FAKES_DIR = Path(__file__).resolve().parent
FAKES_BIN = FAKES_DIR / "bin"

# Values tried for a list option (an absolute path, as callers are told to pass).
LIST_VALUES: tuple[list[str], ...] = ([], ["/tmp"])
SESSION_VALUES = (None, "0199a213-81c0-7800-8aa1-bbab2a035a53")
MODEL_VALUES = (None, "some-model")

# (provider, the command whose dialect is built): gemini has two CLIs with different argv.
DIALECTS: tuple[tuple[str, str], ...] = (
    ("claude", "claude"), ("codex", "codex"), ("gemini", "agy"), ("gemini", "gemini"),
    ("grok", "grok"), ("mistral", "vibe"), ("devin", "devin"), ("cursor", "cursor-agent"),
)


def load_fakecli() -> types.ModuleType:
    """tests/fakes/fakecli.py (the fakes' argv tables are the snapshot's flags)."""
    from tests.fakes import fakecli

    return fakecli


def field_values(annotation: Any) -> list[Any]:
    """Every value worth trying for one options field: each Literal choice (and None when
    optional), both booleans, an empty and a non-empty list."""
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return [False, True]
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        values: list[Any] = []
        for arg in typing.get_args(annotation):
            values.extend([None] if arg is type(None) else field_values(arg))
        return values
    if origin is list:
        return [list(v) for v in LIST_VALUES]
    raise AssertionError(f"no test values for options annotation {annotation!r}")


def option_sets(provider: CliProvider) -> Iterator[dict[str, Any]]:
    """The full product of every options field's values."""
    fields = provider.options_model.model_fields
    names = list(fields)
    for combo in itertools.product(*(field_values(fields[n].annotation) for n in names)):
        yield dict(zip(names, combo, strict=True))


def single_option_sets(provider: CliProvider) -> Iterator[dict[str, Any]]:
    """Each field's values one at a time (the others at their defaults): every value once."""
    yield {}
    for name, info in provider.options_model.model_fields.items():
        for value in field_values(info.annotation):
            if value != info.get_default(call_default_factory=True):
                yield {name: value}


def request(provider: CliProvider, options: dict[str, Any], *, prompt: str = "say hi",
            session_id: str | None = None, model: str | None = None) -> ProviderRequest:
    opts: ProviderOptions = provider.options_model.model_validate(options)
    return ProviderRequest(prompt=prompt, model=model, session_id=session_id, options=opts)


def provider(name: str) -> CliProvider:
    return CLI_PROVIDERS[name]


def covering_cases(provider: CliProvider) -> list[dict[str, Any]]:
    """Few requests that together use every value of every option field, and a model.

    Run k takes each field's k-th value (cycling), so the number of runs is the size of the
    largest field: for tests that pay for each run (the real CLIs). The full product of
    values is checked by the argv golden test without running anything.
    """
    fields = provider.options_model.model_fields
    axes = {name: field_values(info.annotation) for name, info in fields.items()}
    axes_model: list[Any] = list(MODEL_VALUES)
    runs = max([len(v) for v in axes.values()] + [len(axes_model)])
    return [{"options": {name: values[k % len(values)] for name, values in axes.items()},
             "model": axes_model[k % len(axes_model)]} for k in range(runs)]
