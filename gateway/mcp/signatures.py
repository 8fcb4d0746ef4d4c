"""Input schemas of the `<provider>_request[_async]` tools, generated from the providers.

Each provider's own options (its `options_model`, or `ApiRequest` for an HTTP API) become
top-level arguments of its tools, with their descriptions, defaults and constraints, so an
agent sees every knob in `tools/list` and the SDK validates them before the tool runs. The
tool function is one generic body; only its `__signature__` differs per provider.

Every tool's arguments are validated strictly (`strict_type`): pydantic's lax mode would take
the string "true" (or "yes", or 1) for a boolean, so `dangerously_bypass_approvals_and_sandbox:
"true"` would widen a run's permissions; "5" for an integer and 5.0 for an integer are
refused too. Only JSON `true` is true (#23 item 9).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, Strict
from pydantic.fields import FieldInfo

from gateway.config import MAX_TIMEOUT_S, MAX_USD
from providers.registry import REPORTS_COST

COMMON_NAMES = frozenset({"prompt", "model", "working_dir", "session_id", "timeout_s",
                          "force_refresh", "isolation", "base_ref", "max_cost_usd", "runs_on"})

# Where the job runs (gateway/jobs/placement.py validates it, with a message that says what
# is accepted): untyped in the schema, so its text costs a few bytes in every provider tool.
RUNS_ON_DESCRIPTION = "here|any|{host,labels,repo}"


def runs_on_param(default: str | None) -> Param:
    """`runs_on`: None ("here") normally; "any" for a provider only a live worker has."""
    return Param("runs_on", annotated(Any, Field(description=RUNS_ON_DESCRIPTION)), default)

JOB_ID = Annotated[str, Field(description="A job_id.")]


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


def cli_common_params(default_timeout_s: float, provider: str,
                      runs_on_default: str | None = None) -> list[Param]:
    """The inputs every CLI provider's request tools take. Their text is in every listed
    provider tool, so it says only what a model needs to fill them in (docs/tools.md has
    the rest)."""
    return [
        Param("prompt", annotated(str, Field(
            description="The task (data, not flags)."))),
        Param("model", annotated(str | None, Field(
            min_length=1, description="See list_models.")), None),
        Param("working_dir", annotated(str | None, Field(
            description="Absolute dir.")), None),
        Param("session_id", annotated(str | None, Field(
            min_length=1, description="An answer's, to resume.")), None),
        Param("timeout_s", annotated(float | None, Field(
            gt=0, le=MAX_TIMEOUT_S, description=f"Wall clock s (default "
                              f"{default_timeout_s:g}).")), None),
        Param("force_refresh", annotated(bool, Field(
            description="Never reuse a job.")), False),
        Param("isolation", annotated(Literal["none", "worktree"] | None, Field(
            description="worktree: its own")), None),
        Param("base_ref", annotated(str | None, Field(
            min_length=1, description="Start (HEAD)")), None),
        # Lean: every byte is in each model's context (docs/tools.md has the rest).
        *([Param("max_cost_usd", annotated(float | None, Field(
            gt=0, le=MAX_USD, description="USD cap")), None)]
          if provider in REPORTS_COST else []),
        runs_on_param(runs_on_default),
    ]


def api_common_params(default_timeout_s: float, provider: str) -> list[Param]:
    """The common inputs that make sense for an HTTP API besides its own request fields
    (prompt and model come from `ApiRequest`; an API has no working dir and no session)."""
    return [p for p in cli_common_params(default_timeout_s, provider)
            if p.name in ("timeout_s", "force_refresh", "runs_on")]


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


def strict_type(annotation: Any) -> Any:
    """The annotation with every scalar leaf (bool, int, float, str) validated strictly, down
    through Annotated, unions and lists: no "true" for True, no "5" or 5.0 for 5. (pydantic
    cannot apply `Strict` to a Literal or a union as a whole, hence the walk.)"""
    if annotation in (bool, int, float, str):
        return Annotated[annotation, Strict()]
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = get_args(annotation)
        return Annotated[(strict_type(inner), *metadata)]
    if origin in (Union, types.UnionType):
        return Union[tuple(strict_type(arg) for arg in get_args(annotation))]  # noqa: UP007
    if origin is list:
        return list[strict_type(get_args(annotation)[0])]  # type: ignore[misc]
    return annotation


def strict_signature(function: Callable[..., Any]) -> inspect.Signature:
    """The function's signature with its annotations evaluated and made strict
    (`strict_type`): what the SDK builds a tool's argument model from."""
    signature = inspect.signature(function, eval_str=True)
    return signature.replace(parameters=[
        p.replace(annotation=strict_type(p.annotation)) for p in signature.parameters.values()])


def signature_of(params: list[Param], context_type: type, return_type: Any) -> inspect.Signature:
    """A keyword-only signature (required first, every argument strict) plus the injected
    `ctx: Context`."""
    ordered = sorted(params, key=lambda p: p.default is not inspect.Parameter.empty)
    parameters = [p.as_parameter().replace(annotation=strict_type(p.annotation))
                  for p in ordered]
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


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as listed, without what only repeats the names and types.

    Every listed tool's schema goes into the calling model's context on every turn, so
    pydantic's generated `title`s (the argument name again) go, an optional argument
    `anyOf: [T, null], default: null` is listed as plain `T` (omitting it is how a model
    says "none"), and so is a boolean defaulting to false or a list defaulting to empty.
    Validation is unaffected: the SDK validates calls with the argument model, not with
    this schema.
    """
    out = {k: v for k, v in schema.items() if k != "title"}
    properties = {}
    for name, prop in schema.get("properties", {}).items():
        prop = {k: v for k, v in prop.items() if k != "title"}
        variants = prop.get("anyOf")
        if (isinstance(variants, list) and prop.get("default", ...) is None
                and {"type": "null"} in variants and len(variants) == 2):
            (kept,) = [v for v in variants if v != {"type": "null"}]
            prop = {**{k: v for k, v in prop.items() if k not in ("anyOf", "default")}, **kept}
        if prop.get("default", ...) is None and not ({"type", "anyOf"} & set(prop)):
            prop = {k: v for k, v in prop.items() if k != "default"}  # untyped: omitted is none
        if prop.get("default", True) in (False, []) and prop.get("type") in ("boolean", "array"):
            prop = {k: v for k, v in prop.items() if k != "default"}  # omitted means that
        properties[name] = prop
    if properties:
        out["properties"] = properties
    return out


def plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
