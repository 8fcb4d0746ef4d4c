"""OpenAI Codex CLI (`codex`, npm `@openai/codex`).

Invocation: `codex exec --json --skip-git-repo-check [--model M] [--sandbox S]
[--dangerously-bypass-approvals-and-sandbox] [--add-dir D]... <extra_args> -- -` with the
prompt on stdin (`-` tells codex to read it; the runner closes stdin after writing, since
`codex exec` waits forever on an open one). A resumed session is
`codex exec resume --json --skip-git-repo-check [--model M] [--config sandbox_mode="S"] ...
-- <SESSION_ID> -`: `exec resume` has no --sandbox or --add-dir, so the sandbox goes through
the equivalent config key and extra directories are refused with a clear message.

Output (`--json`): JSONL events — `thread.started` (thread_id = the session id),
`item.completed` items (the answer is the last `agent_message`), `turn.completed` with
usage, `turn.failed` / `error` on failure. With no network codex keeps emitting
"Reconnecting..." error events until it is stopped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from providers.base import (
    AbsolutePath,
    CliProvider,
    InvalidRequest,
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
from providers.parsing import Stdout, as_str, decode, strip_ansi, tail

AUTH_FAILURE = re.compile(
    r"401 Unauthorized|Not logged in|codex login|Missing bearer|invalid_api_key"
    r"|Incorrect API key|access token could not be refreshed|refresh token",
    re.IGNORECASE,
)


class CodexOptions(ProviderOptions):
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] | None = Field(
        default=None,
        description=(
            "Omit: the user's default."
        ),
    )
    dangerously_bypass_approvals_and_sandbox: bool = Field(
        default=False,
        description='Only on hosts sandboxed from outside.',
    )
    add_dirs: list[AbsolutePath] = Field(
        default_factory=list,
        description=(
            "Absolute dirs also writable; new sessions only."
        ),
    )


class CodexProvider(CliProvider):
    name: ClassVar[str] = "codex"
    commands: ClassVar[tuple[str, ...]] = ("codex",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.STREAMS
    login_hint: ClassVar[str] = "Run `codex login` and retry."
    install_hint: ClassVar[str] = "npm install -g @openai/codex"
    options_model: ClassVar[type[ProviderOptions]] = CodexOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("gpt-5.5", "gpt-5.4", "gpt-5.4-mini")
    login_check: ClassVar[LoginCheck] = LoginCheck(
        status_argv=("login", "status"), status_exit_1_is_no=True,
        files=("$CODEX_HOME/auth.json", "~/.codex/auth.json"),
        env_keys=("OPENAI_API_KEY", "CODEX_API_KEY"))
    reports_cost: ClassVar[bool] = False  # tokens only: the cost is estimated

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(CodexOptions, request.options)
        resuming = request.session_id is not None
        argv = [command, "exec"] + (["resume"] if resuming else [])
        argv += ["--json", "--skip-git-repo-check"]
        model = effective_model(request, default_model)
        if model:
            argv += ["--model", model]
        if options.sandbox:
            # `exec resume` has no --sandbox flag; the config key is the same setting.
            argv += (["--config", f'sandbox_mode="{options.sandbox}"'] if resuming
                     else ["--sandbox", options.sandbox])
        if options.dangerously_bypass_approvals_and_sandbox:
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        if options.add_dirs:
            if resuming:
                raise InvalidRequest(
                    "codex cannot add directories to a resumed session (`codex exec resume` "
                    "has no --add-dir); drop add_dirs or start a new session.")
            for directory in options.add_dirs:
                argv += ["--add-dir", directory]
        argv += extra
        argv += ["--", request.session_id, "-"] if request.session_id else ["--", "-"]
        return finish(argv, stdin=request.prompt.encode("utf-8"))

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        events = 0
        session_id: str | None = None
        answer: str | None = None
        usage: Usage | None = None
        turn_failure: str | None = None
        last_error: str | None = None
        completed = False
        for event in stdout.json_objects():
            kind = event.get("type")
            if not isinstance(kind, str):
                continue
            events += 1
            if kind == "thread.started":
                session_id = as_str(event.get("thread_id")) or session_id
            elif kind == "item.completed":
                item = event.get("item")
                if isinstance(item, Mapping) and item.get("type") == "agent_message":
                    answer = as_str(item.get("text")) or answer
            elif kind == "turn.completed":
                completed = True
                usage = _usage(event.get("usage")) or usage
            elif kind == "turn.failed":
                turn_failure = _error_message(event) or "the turn failed"
            elif kind == "error":
                last_error = as_str(event.get("message")) or last_error
        if not events:
            return stdout_answer(exit_code)
        is_error = (turn_failure is not None or failed(exit_code)
                    or (not completed and answer is None))
        text = answer if answer is not None else (turn_failure or last_error or "")
        extra: dict[str, Any] = {}
        if turn_failure or (is_error and last_error):
            extra["error"] = turn_failure or last_error
        if not completed:
            extra["incomplete"] = True
        return ProviderResult(text=text, session_id=session_id, usage=usage,
                              is_error=is_error, extra=extra)

    def auth_error_in(self, stdout: Stdout, stderr: bytes, exit_code: int | None) -> bool:
        turn_failed = False
        messages: list[str] = []
        for event in stdout.json_objects():
            kind = event.get("type")
            turn_failed = turn_failed or kind == "turn.failed"
            if kind in ("turn.failed", "error") and (message := _error_message(event)):
                messages.append(message)
        if not (failed(exit_code) or turn_failed):
            return False
        messages.append(tail(strip_ansi(decode(stderr))))
        return any(AUTH_FAILURE.search(m) for m in messages)


def _error_message(event: Mapping[str, Any]) -> str | None:
    error = event.get("error")
    if isinstance(error, Mapping):
        return as_str(error.get("message"))
    return as_str(error) or as_str(event.get("message"))


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    usage = Usage()
    for name, key in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                      ("cache_read_tokens", "cached_input_tokens")):
        usage.read(name, raw.get(key))
    return usage.found()
