"""Claude Code (`claude`, npm `@anthropic-ai/claude-code`).

Invocation: `claude --print --output-format <fmt> [--verbose --include-partial-messages]
[--model M] [--permission-mode P] [--add-dir D]... [--resume ID] <extra_args>` with the
prompt on stdin, so it can never be read as a flag and is not bound by the kernel's
per-argument size limit. stream-json needs `--verbose` in print mode (the CLI refuses it
otherwise).

Output: `json` is one result object; `stream-json` is NDJSON (`system/init`, `assistant`,
`stream_event` partials, and a final `result`). The result carries the answer text, the
session id, usage, cost and `is_error`. A not-logged-in run is such a result with
`is_error: true` and "Not logged in · Please run /login", exit code 1.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from providers.base import (
    AbsolutePath,
    CliProvider,
    Invocation,
    LoginCheck,
    OutputDiscipline,
    ProviderOptions,
    ProviderRequest,
    ProviderResult,
)
from providers.common import (
    effective_model,
    finish,
    options_as,
    start_checks,
    usd_arg,
)
from providers.parsing import Stdout
from providers.result_events import has_auth_error_event, parse_claude_style

AUTH_FAILURE = re.compile(
    r"Not logged in|Please run /login|Invalid API key|OAuth token (?:has expired|revoked)"
    r"|authentication_failed|Failed to authenticate",
    re.IGNORECASE,
)


class ClaudeOptions(ProviderOptions):
    output_format: Literal["stream-json", "json", "text"] = Field(
        default="stream-json",
        description=(
            "text: the answer only."
        ),
    )
    permission_mode: (
        Literal["acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk", "plan"] | None
    ) = Field(
        default=None,
        description=(
            "plan: read-only; bypassPermissions: sandboxed hosts only."
        ),
    )
    add_dirs: list[AbsolutePath] = Field(
        default_factory=list,
        description='Absolute dirs also writable.',
    )


class ClaudeProvider(CliProvider):
    name: ClassVar[str] = "claude"
    commands: ClassVar[tuple[str, ...]] = ("claude",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.STREAMS
    login_hint: ClassVar[str] = ("Run `claude` once and log in with /login (or "
                                 "`claude setup-token`), then retry.")
    install_hint: ClassVar[str] = "npm install -g @anthropic-ai/claude-code"
    options_model: ClassVar[type[ProviderOptions]] = ClaudeOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("opus", "sonnet", "haiku", "fable")
    login_check: ClassVar[LoginCheck] = LoginCheck(
        files=("~/.claude/.credentials.json",),
        env_keys=("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"), in_macos_keychain=True)
    reports_cost: ClassVar[bool] = True  # total_cost_usd

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(ClaudeOptions, request.options)
        argv = [command, "--print", "--output-format", options.output_format]
        if options.output_format == "stream-json":
            argv += ["--verbose", "--include-partial-messages"]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.permission_mode:
            argv += ["--permission-mode", options.permission_mode]
        for directory in options.add_dirs:
            argv += ["--add-dir", directory]
        if request.max_cost_usd is not None:
            # The CLI stops itself at this figure (its estimate on a subscription login too).
            argv += ["--max-budget-usd", usd_arg(request.max_cost_usd)]
        if request.session_id:
            argv += ["--resume", request.session_id]
        argv += extra
        return finish(argv, stdin=request.prompt.encode("utf-8"))

    def output_discipline(self, options: ProviderOptions | None = None) -> OutputDiscipline:
        fmt = options_as(ClaudeOptions, options).output_format
        return OutputDiscipline.STREAMS if fmt == "stream-json" else OutputDiscipline.AT_EXIT

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        return parse_claude_style(stdout, exit_code)

    def auth_error_in(self, stdout: Stdout, stderr: bytes, exit_code: int | None) -> bool:
        if has_auth_error_event(stdout.json_objects(), AUTH_FAILURE):
            return True
        return super().auth_error_in(stdout, stderr, exit_code)
