"""xAI Grok Build CLI (`grok`).

Invocation: `grok [--output-format json|streaming-json] [--model M] [--permission-mode P]
[--always-approve] [--resume ID] <extra_args> -p=<prompt>`. `-p` takes the prompt as its
value; the one-element `-p=<prompt>` form keeps a prompt that starts with '-' a value.

Output: `plain` is the answer; `json` is one (often pretty-printed) object
`{text, stopReason, sessionId, usage, ...}`; `streaming-json` is NDJSON `thought` / `text`
deltas (`data`) and a final `end` with stopReason, sessionId and snake_case usage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from providers.base import (
    CliProvider,
    Invocation,
    LoginCheck,
    OutputDiscipline,
    ProviderOptions,
    ProviderRequest,
    ProviderResult,
    failed,
)
from providers.common import (
    effective_model,
    finish,
    options_as,
    start_checks,
    stdout_answer,
)
from providers.figures import Usage
from providers.parsing import Stdout, as_str

AUTH_FAILURE = re.compile(
    r"not (?:logged|signed) in|unauthenticated|unauthori[sz]ed|\b401\b|XAI_API_KEY"
    r"|grok login|invalid api key|authentication (?:required|failed)",
    re.IGNORECASE,
)
STREAM_TYPES = frozenset({"text", "thought", "end", "error", "max_turns_reached"})


class GrokOptions(ProviderOptions):
    output_format: Literal["streaming-json", "json", "plain"] = Field(
        default="streaming-json",
        description=(
            "'streaming-json': streams, then session id and usage; "
            "'json': one result at the end; 'plain': only the answer."
        ),
    )
    permission_mode: (
        Literal["default", "acceptEdits", "auto", "dontAsk", "bypassPermissions", "plan"] | None
    ) = Field(
        default=None,
        description=(
            "--permission-mode; headless, only 'bypassPermissions' and "
            "'default' fully apply (tools needing approval are cancelled). Omit "
            "for the CLI's default."
        ),
    )
    always_approve: bool = Field(
        default=False,
        description=(
            "Approve every tool call (--always-approve); else tools needing "
            "approval are cancelled."
        ),
    )


class GrokProvider(CliProvider):
    name: ClassVar[str] = "grok"
    commands: ClassVar[tuple[str, ...]] = ("grok",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.STREAMS
    login_hint: ClassVar[str] = (
        "Run `grok login` (or set XAI_API_KEY in [providers.grok].env) and retry.")
    install_hint: ClassVar[str] = "curl -fsSL https://x.ai/cli/install.sh | bash"
    options_model: ClassVar[type[ProviderOptions]] = GrokOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("grok-4.5", "grok-4", "grok-composer-2.5-fast")
    login_check: ClassVar[LoginCheck] = LoginCheck(env_keys=("XAI_API_KEY",))
    reports_cost: ClassVar[bool] = False

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(GrokOptions, request.options)
        argv = [command]
        if options.output_format != "plain":
            argv += ["--output-format", options.output_format]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.permission_mode:
            argv += ["--permission-mode", options.permission_mode]
        if options.always_approve:
            argv.append("--always-approve")
        if request.session_id:
            argv += ["--resume", request.session_id]
        argv += extra
        argv.append("-p=" + request.prompt)
        return finish(argv)

    def output_discipline(self, options: ProviderOptions | None = None) -> OutputDiscipline:
        fmt = options_as(GrokOptions, options).output_format
        return OutputDiscipline.STREAMS if fmt == "streaming-json" else OutputDiscipline.AT_EXIT

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        streamed = _from_stream(stdout.json_objects(), exit_code)
        if streamed is not None:
            return streamed
        document = stdout.json_document()
        if isinstance(document, Mapping) and ("text" in document or "sessionId" in document):
            return _from_object(document, exit_code)
        return stdout_answer(exit_code)


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    usage = Usage()
    for name, key in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                      ("cache_read_tokens", "cache_read_input_tokens")):
        usage.read(name, raw.get(key))
    return usage.found()


def _extra(source: Mapping[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for key, name in (("stopReason", "stop_reason"), ("num_turns", "num_turns"),
                      ("requestId", "request_id")):
        if source.get(key) is not None:
            extra[name] = source[key]
    model_usage = source.get("modelUsage")
    if isinstance(model_usage, Mapping) and model_usage:
        extra["model"] = str(next(iter(model_usage)))
    return extra


def _from_stream(events: Iterable[Mapping[str, Any]],
                 exit_code: int | None) -> ProviderResult | None:
    """The result of a `streaming-json` run, read one event at a time (only the text deltas,
    the last `end` and the last error are kept); None when no such event came."""
    streamed = False
    deltas: list[str] = []
    end: Mapping[str, Any] | None = None
    error: str | None = None
    for event in events:
        kind = event.get("type")
        if kind not in STREAM_TYPES:
            continue
        streamed = True
        if kind == "text":
            deltas.append(as_str(event.get("data")) or as_str(event.get("text")) or "")
        elif kind == "end":
            end = event
        elif kind == "error":
            error = as_str(event.get("message")) or "grok reported an error"
    if not streamed:
        return None
    extra: dict[str, Any] = _extra(end) if end else {"incomplete": True}
    if error is not None:
        extra["error"] = error
    return ProviderResult(
        text="".join(deltas) or error or "",
        session_id=as_str(end.get("sessionId")) if end else None,
        usage=_usage(end.get("usage")) if end else None,
        is_error=error is not None or end is None or failed(exit_code), extra=extra,
    )


def _from_object(document: Mapping[str, Any], exit_code: int | None) -> ProviderResult:
    error = document.get("error")
    error_text = (as_str(error.get("message")) if isinstance(error, Mapping) else as_str(error))
    extra = _extra(document)
    if error_text:
        extra["error"] = error_text
    return ProviderResult(
        text=as_str(document.get("text")) or error_text or "",
        session_id=as_str(document.get("sessionId")), usage=_usage(document.get("usage")),
        is_error=bool(error) or failed(exit_code), extra=extra,
    )
