"""Turn a SubmitRequest into a validated target: what to run and the normalized request.

Everything a caller can get wrong is checked here, before any row is written or anything
is spawned, and reported as GatewayError(invalid_input | not_found) with what to do.

A target is one of two shapes, one per transport, so nothing downstream checks for fields
of the other: a `CliTarget` (a provider CLI run as a process group; a `CliLaunch` also has
the argv to start it here) or an `HttpTarget` (one call to an HTTP model API).
"""

from __future__ import annotations

import contextlib
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ValidationError

from gateway.config import MAX_TIMEOUT_S, ApiProviderConfig, Settings
from gateway.jobs.budgets import plan
from gateway.jobs.requests import TIMEOUT_KEY, SubmitRequest, stored_fields
from gateway.jobs.worktrees.create import Repository, WorktreePlan, inspect_repository, plan_of
from gateway.jobs.worktrees.remote import origin_url
from gateway.model import ErrorKind, GatewayError, Reservation
from providers.base import (
    CliProvider,
    InvalidRequest,
    Invocation,
    OutputDiscipline,
    ProviderOptions,
    ProviderRequest,
)
from providers.registry import CLI_PROVIDERS, check_argv_size, missing_command, provider_binary

SHOWN_PATH_CHARS = 200  # an error message quotes at most this much of a caller's path


@dataclass(slots=True, kw_only=True)
class _AdmittedTarget:
    """What admitting, storing and finalizing a job reads, whatever its transport."""

    provider: str
    normalized: dict[str, Any]  # hashed into the request key and stored as request_json
    model: str | None
    working_dir: str | None
    login_hint: str = ""  # what an auth failure's message tells the caller to do
    # what admitting it reserves of [budgets], in their fixed order (budgets.plan)
    reservations: tuple[Reservation, ...] = ()
    # isolation = "worktree": the repository working_dir is in, and base_ref's commit. Only
    # a CLI request can be isolated; the manager plans every target alike, so an HTTP
    # target has both too, always None.
    repository: Repository | None = None
    worktree: WorktreePlan | None = None  # set once the job has an id (its plan)


@dataclass(slots=True, kw_only=True)
class CliTarget(_AdmittedTarget):
    """A job of a provider CLI: what its run's output is parsed with. A run adopted from
    another gateway has only this: its argv is in the spec its first gateway wrote."""

    transport: ClassVar[Literal["process"]] = "process"
    adapter: CliProvider
    options: ProviderOptions  # the validated options: the parser reads some (output format)
    install_hint: str = ""
    idle_timeout: bool = True  # whether limits.idle_timeout_s applies (the CLI streams)


@dataclass(slots=True, kw_only=True)
class CliLaunch(CliTarget):
    """A CLI job this gateway can start: the argv, environment and stdin its adapter built."""

    invocation: Invocation


@dataclass(slots=True, kw_only=True)
class HttpTarget(_AdmittedTarget):
    """A job that is one call to a configured HTTP model API; `normalized` is exactly what
    the call sends (http_call.call_normalized), so the request is normalized once."""

    transport: ClassVar[Literal["http"]] = "http"
    api_config: ApiProviderConfig


Target = CliTarget | HttpTarget  # what a job drives: a CLI run (launched or adopted) or a call


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def _pydantic_problem(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
    return "; ".join(parts)


def _check_prompt(prompt: str | None, settings: Settings) -> str:
    if prompt is None or not prompt.strip():
        raise _invalid("prompt is empty: pass the task for the agent in `prompt`.")
    if "\x00" in prompt:
        raise _invalid("prompt contains a NUL byte, which no CLI can receive; remove it.")
    size = len(prompt.encode("utf-8"))
    if size > settings.limits.max_prompt_bytes:
        raise _invalid(f"prompt is {size} bytes, over limits.max_prompt_bytes "
                       f"({settings.limits.max_prompt_bytes}); shorten it or put the material "
                       f"in a file under working_dir and refer to it.")
    return prompt


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string in a normalized request (prompt, messages, system,
    options, model, session id): what max_prompt_bytes bounds."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(_text_bytes(k) + _text_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_bytes(v) for v in value)
    return 0


def _check_request_size(normalized: dict[str, Any], settings: Settings) -> None:
    size = _text_bytes(normalized)
    if size > settings.limits.max_prompt_bytes:
        raise _invalid(f"the request's text (prompt, messages, system, options) is {size} "
                       f"bytes, over limits.max_prompt_bytes "
                       f"({settings.limits.max_prompt_bytes}); shorten it or put the material "
                       f"in a file under working_dir and refer to it.")


def _check_timeout(timeout_s: float | None) -> None:
    # `not (0 < t <= max)` also refuses NaN; infinity (1e999 in JSON) is over the bound.
    if timeout_s is not None and not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise _invalid(f"timeout_s must be a positive number of seconds, at most "
                       f"{MAX_TIMEOUT_S} (one week); got {timeout_s!r}. Omit it for the "
                       f"default (limits.default_timeout_s).")


def _check_cost(max_cost_usd: float | None) -> float | None:
    # `not (x > 0)` also refuses NaN; infinity is no cap at all.
    if max_cost_usd is not None and not 0 < max_cost_usd < float("inf"):
        raise _invalid(f"max_cost_usd must be a positive number of US dollars; got "
                       f"{max_cost_usd!r}. Omit it for the configured reservation.")
    return max_cost_usd


def _check_working_dir(working_dir: str | None) -> str | None:
    if working_dir is None or working_dir == "":
        return None
    if "\x00" in working_dir:
        raise _invalid("working_dir contains a NUL byte.")
    shown = working_dir[:SHOWN_PATH_CHARS] + ("..." if len(working_dir) > SHOWN_PATH_CHARS else "")
    try:
        path = Path(working_dir).expanduser()
        if not path.is_absolute():
            raise _invalid(f"working_dir {shown!r} must be an absolute path (the gateway's "
                           f"own current directory means nothing to the caller).")
        if not path.is_dir():
            raise _invalid(f"working_dir {shown!r} does not exist or is not a directory.")
        return str(path.resolve())
    except (OSError, RuntimeError) as exc:
        # ENAMETOOLONG, EACCES on a parent, ELOOP, an unknown ~user: the caller's path.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _invalid(f"working_dir {shown!r} cannot be used: {reason}. Pass an existing, "
                       f"accessible directory.") from None


def _check_isolation(settings: Settings, request: SubmitRequest,
                     working_dir: str | None) -> Repository | None:
    """The repository an isolated request runs a worktree of (None: not isolated). Runs
    `git rev-parse` in working_dir: a request that cannot be isolated is refused here,
    before anything is stored or run."""
    isolation = request.isolation or settings.worktrees.default_isolation
    if isolation not in ("none", "worktree"):
        raise _invalid(f"isolation must be \"none\" or \"worktree\"; got {isolation!r}.")
    if isolation == "none":
        if request.base_ref is not None:
            raise _invalid("base_ref is for isolation = \"worktree\" (the commit its worktree "
                           "starts from); pass isolation = \"worktree\" or omit base_ref.")
        return None
    if working_dir is None:
        raise _invalid("isolation = \"worktree\" needs working_dir: a directory inside the "
                       "git repository to make the job's worktree of.")
    return inspect_repository(working_dir, request.base_ref)


def resolve_target(settings: Settings, provider: str,
                   request: SubmitRequest) -> CliLaunch | HttpTarget:
    """Validate the request for `provider` and build what will run. No I/O beyond stat()."""
    if provider in settings.api_providers:
        return http_target(settings, provider, request)
    return cli_target(settings, provider, request)


@dataclass(slots=True)
class _CliRequest:
    """A CLI request checked, before anything of this host (its binary) is looked at."""

    adapter: CliProvider
    options: ProviderOptions
    normalized: dict[str, Any]
    model: str | None
    working_dir: str | None
    repository: Repository | None
    reservations: tuple[Reservation, ...]
    max_cost_usd: float | None


def _checked_cli_request(settings: Settings, provider: str, request: SubmitRequest, *,
                         here: bool) -> _CliRequest:
    """Everything about a CLI request that can be checked without running it. `here`: it
    runs on this host, so its working_dir must exist here and may be isolated; a job for
    another host (runs_on) names a working_dir of that host, checked there."""
    _check_timeout(request.timeout_s)
    adapter = CLI_PROVIDERS.get(provider)
    config = settings.providers.get(provider)
    if adapter is None or config is None:
        known = sorted([*CLI_PROVIDERS, *settings.api_providers])
        close = difflib.get_close_matches(provider, known, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise _invalid(f"unknown provider {provider!r}{hint}; known providers: "
                       f"{', '.join(known)}.")
    if not config.enabled:
        raise _invalid(f"provider {provider!r} is disabled in the gateway config "
                       f"([providers.{provider}] enabled = false).")
    prompt = _check_prompt(request.prompt, settings)
    if here:
        working_dir = _check_working_dir(request.working_dir)
        repository = _check_isolation(settings, request, working_dir)
    else:
        working_dir = _check_remote_working_dir(request.working_dir)
        repository = _check_remote_isolation(request, working_dir)
    try:
        options = adapter.options_model.model_validate(dict(request.options or {}))
    except ValidationError as exc:
        raise _invalid(f"invalid {provider} options: {_pydantic_problem(exc)}") from None
    model = request.model or config.default_model
    budget = plan(settings, provider, _check_cost(request.max_cost_usd))
    normalized: dict[str, Any] = {
        "provider": provider,
        "prompt": prompt,
        "model": model,
        "working_dir": working_dir,
        "session_id": request.session_id,
        "options": options.model_dump(mode="json", exclude_none=True),
    }
    if repository is not None:  # only then: the request keys of other jobs stay as they were
        normalized.update(isolation="worktree", base_ref=request.base_ref or "HEAD",
                          base_sha=repository.base_sha)
        if not here:  # the worker's checkout of it, and where in it the CLI runs
            normalized.update(repo=_remote_repo(request, repository), subdir=repository.subdir)
    if request.max_cost_usd is not None:  # a different cap is a different request
        normalized["max_cost_usd"] = request.max_cost_usd
    _check_request_size(normalized, settings)
    return _CliRequest(adapter=adapter, options=options, normalized=normalized, model=model,
                       working_dir=working_dir, repository=repository,
                       reservations=budget.reservations, max_cost_usd=budget.cap_usd)


def _check_remote_isolation(request: SubmitRequest,
                            working_dir: str | None) -> Repository | None:
    """A worktree job for another host (issue 42): working_dir is this host's checkout,
    where its changes are applied; its base commit is read here, and the worker makes the
    worktree from its own checkout at that commit."""
    if (request.isolation or "none") == "none":
        if request.base_ref is not None:
            raise _invalid("base_ref is for isolation = \"worktree\" (the commit its worktree "
                           "starts from); pass isolation = \"worktree\" or omit base_ref.")
        return None
    if request.isolation != "worktree":
        raise _invalid(f"isolation must be \"none\" or \"worktree\"; got "
                       f"{request.isolation!r}.")
    if working_dir is None:
        raise _invalid("isolation = \"worktree\" with runs_on needs working_dir: this host's "
                       "checkout, whose commit the worker starts from and where apply puts "
                       "the changes.")
    return inspect_repository(working_dir, request.base_ref)


def _remote_repo(request: SubmitRequest, repository: Repository) -> str:
    """The repository a worker must hold: runs_on's `repo` (a name in its [worker] repos,
    or an origin URL), else this checkout's origin URL."""
    selector = request.runs_on if isinstance(request.runs_on, dict) else {}
    named = selector.get("repo")
    if isinstance(named, str) and named:
        return named
    origin = origin_url(repository.toplevel)
    if origin is None:
        raise _invalid(f"The checkout {repository.toplevel!r} has no origin remote, so no "
                       f"worker's checkout can be matched to it: name it with runs_on="
                       f"{{\"repo\": NAME}} (a name in the worker's [worker] repos).")
    return origin


def _check_remote_working_dir(working_dir: str | None) -> str | None:
    """A working_dir on another host: absolute, without a NUL; its host checks the rest."""
    if working_dir is None or working_dir == "":
        return None
    if "\x00" in working_dir or not working_dir.startswith("/"):
        shown = working_dir[:SHOWN_PATH_CHARS]
        raise _invalid(f"working_dir {shown!r} must be an absolute path on the host that "
                       f"runs the job.")
    return working_dir


def cli_target(settings: Settings, provider: str, request: SubmitRequest) -> CliLaunch:
    """Validate a request for the CLI provider `provider` and build its argv (the CLI must
    be found). Raises GatewayError(invalid_input | not_found)."""
    checked = _checked_cli_request(settings, provider, request, here=True)
    config = settings.providers[provider]
    adapter = checked.adapter
    preq = ProviderRequest(prompt=checked.normalized["prompt"], model=checked.model,
                           working_dir=checked.working_dir, session_id=request.session_id,
                           options=checked.options, max_cost_usd=checked.max_cost_usd)
    command = provider_binary(provider, config.command, os.environ.get("PATH", ""))
    if command is None:
        raise GatewayError(ErrorKind.NOT_FOUND,
                           missing_command(provider, config.command, os.environ.get("PATH", "")))
    try:
        invocation = adapter.build_invocation(preq, command, list(config.extra_args),
                                              checked.model)
        check_argv_size(invocation.argv)
    except InvalidRequest as exc:
        raise _invalid(str(exc)) from None
    invocation.env = {**config.env, **invocation.env}
    return CliLaunch(provider=provider, normalized=checked.normalized, model=checked.model,
                     working_dir=checked.working_dir, login_hint=adapter.login_hint,
                     install_hint=adapter.install_hint, adapter=adapter,
                     options=checked.options, invocation=invocation,
                     repository=checked.repository, reservations=checked.reservations,
                     idle_timeout=adapter.output_discipline(checked.options)
                     == OutputDiscipline.STREAMS)


def remote_target(settings: Settings, provider: str,
                  request: SubmitRequest) -> CliTarget | HttpTarget:
    """Validate a request that another host will run (runs_on): all but what only that host
    can check (its CLI, its working_dir); the worker builds the argv when it claims it."""
    if provider in settings.api_providers:
        return http_target(settings, provider, request)
    checked = _checked_cli_request(settings, provider, request, here=False)
    adapter = checked.adapter
    return CliTarget(provider=provider, normalized=checked.normalized, model=checked.model,
                     working_dir=checked.working_dir, login_hint=adapter.login_hint,
                     install_hint=adapter.install_hint, adapter=adapter,
                     options=checked.options, reservations=checked.reservations)


def http_target(settings: Settings, provider: str, request: SubmitRequest) -> HttpTarget:
    """Validate a request for the configured API provider `provider` and normalize it: the
    one normalization, which the call sends and the row stores. Raises
    GatewayError(invalid_input)."""
    _check_timeout(request.timeout_s)
    # The HTTP stack: only an API provider's request loads it.
    from providers.http.request import ApiRequest, normalized_request  # deferred: start-up

    config = settings.api_providers[provider]
    fields = dict(request.options or {})
    if request.prompt is not None:
        fields["prompt"] = request.prompt
    if request.model is not None:
        fields["model"] = request.model
    try:
        api_request = ApiRequest.model_validate(fields)
    except ValidationError as exc:
        raise _invalid(f"invalid {provider} request: {_pydantic_problem(exc)}") from None
    if api_request.prompt is not None:
        _check_prompt(api_request.prompt, settings)
    try:
        normalized = normalized_request(provider, config, api_request)
    except InvalidRequest as exc:
        raise _invalid(str(exc)) from None
    _check_request_size(normalized, settings)
    login_hint = (f"Check the API key in the environment variable {config.api_key_env} and "
                  f"retry." if config.api_key_env else "")
    return HttpTarget(provider=provider, normalized=normalized,
                      reservations=plan(settings, provider, None).reservations,
                      model=normalized.get("model"), working_dir=None, login_hint=login_hint,
                      api_config=config)


def request_of_row(request_json: str) -> tuple[str | None, SubmitRequest]:
    """The SubmitRequest a stored job was admitted with, rebuilt from its normalized request
    (for a re-queued job: the row is all that is left of it), with the caller's timeout_s
    (stored beside it, outside the request key; None: the default)."""
    normalized = stored_fields(request_json)
    timeout = normalized.get(TIMEOUT_KEY)
    timeout_s = float(timeout) if isinstance(timeout, (int, float)) else None
    if normalized.get("transport") == "http":
        options = {key: normalized[key] for key in ("system", "temperature", "max_output_tokens")
                   if normalized.get(key) is not None}
        options["messages"] = normalized.get("messages")
        return normalized.get("provider"), SubmitRequest(
            model=normalized.get("model"), options=options, timeout_s=timeout_s)
    cap = normalized.get("max_cost_usd")
    return normalized.get("provider"), SubmitRequest(
        prompt=normalized.get("prompt"), model=normalized.get("model"),
        working_dir=normalized.get("working_dir"), session_id=normalized.get("session_id"),
        options=dict(normalized.get("options") or {}), timeout_s=timeout_s,
        isolation=normalized.get("isolation") or "none",
        # the commit it was admitted with, not the ref: a re-queued run starts from it too
        base_ref=normalized.get("base_sha") if normalized.get("isolation") else None,
        max_cost_usd=float(cap) if isinstance(cap, (int, float)) else None)


def target_for_row(settings: Settings, provider: str,
                   request_json: str) -> CliLaunch | HttpTarget:
    """The Target of a stored job: to run it again (re-queue) or to parse what an adopted
    run wrote. Raises GatewayError when it cannot be rebuilt (provider gone from the config,
    CLI uninstalled, working_dir removed)."""
    _, request = request_of_row(request_json)
    target = resolve_target(settings, provider, request)
    target.worktree = plan_of(request_json)
    return target


def parsing_target(settings: Settings, provider: str, request_json: str) -> CliTarget:
    """What an adopter needs to finalize a CLI run it did not start: the adapter and the
    options to parse its output with. Unlike target_for_row it needs neither the CLI nor
    the working dir any more (the run is over or running). Raises GatewayError."""
    with contextlib.suppress(GatewayError):
        target = target_for_row(settings, provider, request_json)
        if isinstance(target, CliTarget):  # a run is a CLI's: never an API call's target
            return target
    adapter = CLI_PROVIDERS.get(provider)
    if adapter is None:
        raise _invalid(f"unknown provider {provider!r}")
    _, request = request_of_row(request_json)
    try:
        options = adapter.options_model.model_validate(dict(request.options or {}))
    except ValidationError as exc:
        raise _invalid(f"invalid {provider} options: {_pydantic_problem(exc)}") from None
    return CliTarget(provider=provider, normalized={}, model=request.model,
                     working_dir=request.working_dir, login_hint=adapter.login_hint,
                     install_hint=adapter.install_hint, adapter=adapter, options=options,
                     worktree=plan_of(request_json))
