"""Devin CLI (`devin`, Cognition).

Invocation: `devin --print [--model M] [--permission-mode P] [--sandbox] [--resume ID]
<extra_args> -- <prompt>`: the prompt comes after `--`, so it is never read as a flag.
Output is the answer as plain text, printed when the run ends (AT_EXIT).
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
    PROMPT_FROM_STDIN,
    effective_model,
    finish,
    options_as,
    start_checks,
    stdout_answer,
)
from providers.parsing import Stdout

AUTH_FAILURE = re.compile(
    r"not (?:logged|signed) in|devin auth login|unauthenticated|unauthori[sz]ed|\b401\b"
    r"|please (?:log|sign) in",
    re.IGNORECASE,
)


class DevinOptions(ProviderOptions):
    permission_mode: Literal["auto", "accept-edits", "smart", "dangerous"] | None = Field(
        default=None,
        description=(
            "--permission-mode: 'accept-edits' may edit; 'smart' approves what "
            "looks safe; 'auto' routine actions; 'dangerous' everything. Omit "
            "for the CLI's default."
        ),
    )
    sandbox: bool = Field(
        default=False,
        description="Run commands in Devin's sandbox (--sandbox; needs bubblewrap on Linux).",
    )


class DevinProvider(CliProvider):
    name: ClassVar[str] = "devin"
    commands: ClassVar[tuple[str, ...]] = ("devin",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.AT_EXIT
    login_hint: ClassVar[str] = "Run `devin auth login` and retry."
    install_hint: ClassVar[str] = "install the Devin CLI (`devin`) and make sure it is on PATH"
    options_model: ClassVar[type[ProviderOptions]] = DevinOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("swe-1.5",)
    # No offline status command, credential file or API key variable known: doctor cannot tell.
    login_check: ClassVar[LoginCheck] = LoginCheck()
    reports_cost: ClassVar[bool] = False

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(DevinOptions, request.options)
        argv = [command, "--print"]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.permission_mode:
            argv += ["--permission-mode", options.permission_mode]
        if options.sandbox:
            argv.append("--sandbox")
        if request.session_id:
            argv += ["--resume", request.session_id]
        argv += extra
        # The prompt goes through stdin, read as the prompt file: argv (which `ps` shows to
        # every local user) never holds it, and no file is left on disk to remove (#23 item 11).
        argv += ["--prompt-file", PROMPT_FROM_STDIN]
        return finish(argv, stdin=request.prompt.encode("utf-8"))

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        return stdout_answer(exit_code)
