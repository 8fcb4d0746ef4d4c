"""Input schemas of the `<provider>_request[_async]` tools, generated from the providers.

Each provider's own options (its `options_model`, or `ApiRequest` for an HTTP API) become
top-level arguments of its tools, with their descriptions, defaults and constraints, so an
agent sees every knob in `tools/list` and the SDK validates them before the tool runs. The
tool function is one generic body; only its `__signature__` differs per provider.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

COMMON_NAMES = frozenset({"prompt", "model", "working_dir", "session_id", "timeout_s",
                          "force_refresh"})


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    annotation: Any  # an Annotated[...] carrying Field(description=...)
    default: Any = inspect.Parameter.empty

    def as_parameter(self) -> inspect.Parameter:
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=self.default, annotation=self.annotation)


def annotated(annotation: Any, *metadata: Any) -> Any:
    return Annotated[(annotation, *metadata)]


def cli_common_params(default_timeout_s: float, provider: str) -> list[Param]:
    """The inputs every CLI provider's request tools take."""
    return [
        Param("prompt", annotated(str, Field(
            description="The task for the agent, as you would type it to the CLI. It is passed "
                        "as data (stdin or after `--`), never read as a flag."))),
        Param("model", annotated(str | None, Field(
            description=f"Model name or alias for {provider}. Omit for the configured "
                        f"default_model or the CLI's own default (list_models shows the "
                        f"known names).")), None),
        Param("working_dir", annotated(str | None, Field(
            description="Absolute path of the directory the agent works in (its cwd). Omit "
                        "for a neutral directory.")), None),
        Param("session_id", annotated(str | None, Field(
            description="The provider's native session id to resume: the `session_id` a "
                        "previous answer of this provider returned. Omit to start a fresh "
                        "session.")), None),
        Param("timeout_s", annotated(float | None, Field(
            gt=0, description=f"Wall-clock limit for the run in seconds (default "
                              f"{default_timeout_s:g}). The job is killed and marked "
                              f"timed_out after it.")), None),
        Param("force_refresh", annotated(bool, Field(
            description="Run again even when an identical request is running or completed "
                        "recently (by default that job is returned instead of a new run).")),
              False),
    ]


def api_common_params(default_timeout_s: float, provider: str) -> list[Param]:
    """The common inputs that make sense for an HTTP API besides its own request fields
    (prompt and model come from `ApiRequest`; an API has no working dir and no session)."""
    return [p for p in cli_common_params(default_timeout_s, provider)
            if p.name in ("timeout_s", "force_refresh")]


def option_params(model: type[BaseModel], reserved: frozenset[str] = COMMON_NAMES) -> list[Param]:
    """One parameter per field of a provider's options model, keeping its description,
    default and constraints (ge/le, Literal enums, min_length...). A field named like a
    `reserved` common argument is a provider bug (it would be ambiguous): ValueError."""
    params: list[Param] = []
    for name, info in model.model_fields.items():
        if name in reserved:
            raise ValueError(f"option {name!r} of {model.__name__} clashes with a common "
                             f"request argument")
        default = (inspect.Parameter.empty if info.is_required()
                   else info.get_default(call_default_factory=True))
        params.append(Param(name, annotated(info.annotation, *info.metadata, _describe(info)),
                            default))
    return params


def _describe(info: FieldInfo) -> FieldInfo:
    kwargs: dict[str, Any] = {}
    if info.description:
        kwargs["description"] = info.description
    if info.title:
        kwargs["title"] = info.title
    if info.examples:
        kwargs["examples"] = info.examples
    if info.json_schema_extra:
        kwargs["json_schema_extra"] = info.json_schema_extra
    field: FieldInfo = Field(**kwargs)
    return field


def signature_of(params: list[Param], context_type: type, return_type: Any) -> inspect.Signature:
    """A keyword-only signature (required first) plus the injected `ctx: Context`."""
    ordered = sorted(params, key=lambda p: p.default is not inspect.Parameter.empty)
    parameters = [p.as_parameter() for p in ordered]
    parameters.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY,
                                        annotation=context_type))
    return inspect.Signature(parameters, return_annotation=return_type)


def options_given(params: list[Param], values: dict[str, Any]) -> dict[str, Any]:
    """The options the caller set to something other than the default, as plain JSON
    values (the provider's own model validates and defaults the rest)."""
    given: dict[str, Any] = {}
    for param in params:
        if param.name not in values:
            continue
        value = values[param.name]
        if param.default is not inspect.Parameter.empty and value == param.default:
            continue
        given[param.name] = plain(value)
    return given


def plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
