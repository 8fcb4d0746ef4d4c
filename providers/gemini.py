"""Gemini: the Antigravity CLI (`agy`), or Google's Gemini CLI (`gemini`, npm
`@google/gemini-cli`) when only that one is installed.

The two parse different argv, so the dialect follows the resolved command's name:
- agy: `agy [--model M] [--mode accept-edits|plan | --dangerously-skip-permissions]
  [--sandbox] [--output-format json] [--conversation ID] <extra_args> --print=<prompt>`.
  `--print` takes the prompt as its value and swallows whatever follows it, so the prompt
  is one `--print=<prompt>` element, last.
- gemini: `gemini [--model M] [--approval-mode MODE] [--sandbox] [--output-format json]
  [--resume ID] <extra_args> --prompt=<prompt>` (yargs: the `=` form keeps a prompt that
  starts with '-' a value).
Both print nothing until they exit (AT_EXIT). Text output is the answer; `json` output is
one object with the answer (`response`), the session (`session_id` / `conversation_id`)
and, for gemini, token stats. An unauthenticated gemini exits 41 with "Please set an Auth
method ..." on stderr.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
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

GEMINI_AUTH_EXIT_CODE = 41  # gemini-cli's FatalAuthenticationError exit status
AUTH_FAILURE = re.compile(
    r"Please set an Auth method|not (?:signed|logged) in|sign in again|Login required"
    r"|authentication (?:required|failed)|GEMINI_API_KEY",
    re.IGNORECASE,
)
# agy's --mode / --dangerously-skip-permissions for each gemini approval mode.
AGY_APPROVAL_ARGS: dict[str, list[str]] = {
    "default": [],
    "auto_edit": ["--mode", "accept-edits"],
    "plan": ["--mode", "plan"],
    "yolo": ["--dangerously-skip-permissions"],
}

Dialect = Literal["agy", "gemini"]


def dialect_of(command: str) -> Dialect:
    """`gemini` for Google's Gemini CLI (a command named gemini*), else `agy`."""
    return "gemini" if os.path.basename(command).lower().startswith("gemini") else "agy"


class GeminiOptions(ProviderOptions):
    approval_mode: Literal["default", "auto_edit", "yolo", "plan"] | None = Field(
        default=None,
        description=(
            "yolo approves every tool. Omit: the CLI's default."
        ),
    )
    output_format: Literal["text", "json"] = Field(
        default="text",
        description=(
            "json adds the session id (and usage)."
        ),
    )
    sandbox: bool = Field(default=False,
                          description=(
                              "Tools in the CLI's sandbox."
                          ))


class GeminiProvider(CliProvider):
    name: ClassVar[str] = "gemini"
    commands: ClassVar[tuple[str, ...]] = ("agy", "gemini")
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.AT_EXIT
    login_hint: ClassVar[str] = (
        "Run `agy` (or `gemini`) once interactively and sign in, or set GEMINI_API_KEY in "
        "[providers.gemini].env, then retry.")
    install_hint: ClassVar[str] = (
        "install the Antigravity CLI (`agy`), or `npm install -g @google/gemini-cli`")
    options_model: ClassVar[type[ProviderOptions]] = GeminiOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = (
        "gemini-2.5-pro", "gemini-2.5-flash", "gemini-3.1-pro-preview", "gemini-3.5-flash")
    login_check: ClassVar[LoginCheck] = LoginCheck(
        files=("~/.gemini/oauth_creds.json",), env_keys=("GEMINI_API_KEY", "GOOGLE_API_KEY"))
    reports_cost: ClassVar[bool] = False  # tokens only: the cost is estimated

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(GeminiOptions, request.options)
        agy = dialect_of(command) == "agy"
        argv = [command]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.approval_mode:
            argv += (AGY_APPROVAL_ARGS[options.approval_mode] if agy
                     else ["--approval-mode", options.approval_mode])
        if options.sandbox:
            argv.append("--sandbox")
        if options.output_format == "json":
            argv += ["--output-format", "json"]
        if request.session_id:
            argv += ["--conversation" if agy else "--resume", request.session_id]
        argv += extra
        argv.append(("--print=" if agy else "--prompt=") + request.prompt)
        return finish(argv)

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        document = stdout.json_document()
        if isinstance(document, Mapping) and _is_envelope(document):
            return _from_envelope(document, exit_code)
        return stdout_answer(exit_code)

    def auth_error_in(self, stdout: Stdout, stderr: bytes, exit_code: int | None) -> bool:
        if exit_code == GEMINI_AUTH_EXIT_CODE:
            return True
        return super().auth_error_in(stdout, stderr, exit_code)


def _is_envelope(document: Mapping[str, Any]) -> bool:
    return ("response" in document or "error" in document) and any(
        key in document for key in ("session_id", "conversation_id", "stats", "status"))


def _from_envelope(document: Mapping[str, Any], exit_code: int | None) -> ProviderResult:
    error = document.get("error")
    error_text = (as_str(error.get("message")) if isinstance(error, Mapping)
                  else as_str(error))
    status = as_str(document.get("status"))
    is_error = bool(error) or (status is not None and status.upper() != "SUCCESS") \
        or failed(exit_code)
    text = as_str(document.get("response")) or error_text or ""
    extra: dict[str, Any] = {}
    if error_text:
        extra["error"] = error_text
    if status:
        extra["status"] = status
    return ProviderResult(
        text=text,
        session_id=as_str(document.get("session_id")) or as_str(document.get("conversation_id")),
        usage=_usage(document), is_error=is_error, extra=extra,
    )


def _usage(document: Mapping[str, Any]) -> Usage | None:
    """gemini: stats.models.<name>.tokens {prompt, candidates, cached}, summed over the
    models; agy: usage {...}. Every figure checked (providers/figures.py)."""
    usage = Usage()
    stats = document.get("stats")
    models = stats.get("models") if isinstance(stats, Mapping) else None
    if isinstance(models, Mapping):
        per_model = [tokens for one in models.values() if isinstance(one, Mapping)
                     and isinstance(tokens := one.get("tokens"), Mapping)]
        for name, key in (("input_tokens", "prompt"), ("output_tokens", "candidates"),
                          ("cache_read_tokens", "cached")):
            usage.read_sum(name, (tokens.get(key) for tokens in per_model))
    raw = document.get("usage")
    if isinstance(raw, Mapping):
        usage.read_first("input_tokens", raw, "input_tokens", "prompt_tokens")
        usage.read_first("output_tokens", raw, "output_tokens", "completion_tokens")
    return usage.found()
