"""Cursor Agent CLI (`cursor-agent`).

Invocation: `cursor-agent --print [--output-format json|stream-json] [--model M]
[--mode plan|ask] [--force] [--sandbox enabled|disabled] [--trust] [--resume ID]
<extra_args> -- <prompt>`: the prompt comes after `--`, so it is never read as a flag.

Output: `text` is the answer; `json` (the default here, because it reports the session id)
is one `{"type": "result", "result": ..., "session_id": ..., "is_error": ...}` object, the
same shape Claude Code prints; `stream-json` is Claude-style NDJSON ending in that result.
On failure the CLI exits non-zero with the message on stderr.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from providers.base import (
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
)
from providers.parsing import Stdout
from providers.result_events import parse_claude_style

AUTH_FAILURE = re.compile(
    r"Authentication required|Not logged in|\[unauthenticated\]|API key is invalid"
    r"|cursor-agent login|agent login|CURSOR_API_KEY",
    re.IGNORECASE,
)


class CursorOptions(ProviderOptions):
    output_format: Literal["json", "stream-json", "text"] = Field(
        default="json",
        description=(
            "'json': answer and session id; 'stream-json': streams, "
            "same result; 'text': only the answer."
        ),
    )
    mode: Literal["plan", "ask"] | None = Field(
        default=None,
        description=(
            "'plan' plans without editing; 'ask' answers read-only. Omit for "
            "the normal agent."
        ),
    )
    force: bool = Field(
        default=False,
        description=(
            "Allow commands without asking (--force); else those needing "
            "approval are refused."
        ),
    )
    sandbox: Literal["enabled", "disabled"] | None = Field(
        default=None, description="Turn Cursor's command sandbox on or off (--sandbox).")
    trust_workspace: bool = Field(
        default=False,
        description=(
            "Trust working_dir without the prompt (--trust); needed in a new "
            "directory."
        ),
    )


class CursorProvider(CliProvider):
    name: ClassVar[str] = "cursor"
    commands: ClassVar[tuple[str, ...]] = ("cursor-agent",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.AT_EXIT
    login_hint: ClassVar[str] = (
        "Run `cursor-agent login` (or set CURSOR_API_KEY in [providers.cursor].env) and retry.")
    install_hint: ClassVar[str] = "curl https://cursor.com/install -fsS | bash"
    options_model: ClassVar[type[ProviderOptions]] = CursorOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("auto", "sonnet-4.5", "gpt-5")
    login_check: ClassVar[LoginCheck] = LoginCheck(status_argv=("status",),
                                                   env_keys=("CURSOR_API_KEY",))
    reports_cost: ClassVar[bool] = False

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(CursorOptions, request.options)
        argv = [command, "--print"]
        if options.output_format != "text":
            argv += ["--output-format", options.output_format]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.mode:
            argv += ["--mode", options.mode]
        if options.force:
            argv.append("--force")
        if options.sandbox:
            argv += ["--sandbox", options.sandbox]
        if options.trust_workspace:
            argv.append("--trust")
        if request.session_id:
            argv += ["--resume", request.session_id]
        argv += extra
        argv += ["--", request.prompt]
        return finish(argv)

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        return parse_claude_style(stdout, exit_code)
