"""Mistral Vibe (`vibe`, PyPI `mistral-vibe`).

Invocation: `vibe [--output json|streaming] [--agent NAME] [--trust] [--resume ID]
<extra_args> --prompt=<prompt>`; the model goes in env `VIBE_ACTIVE_MODEL` (vibe has no
--model flag). `--prompt` takes an optional value (argparse nargs='?'), so the prompt is
one `--prompt=<prompt>` element.

Output: `text` is the last assistant message; `json` is the whole history as a JSON array
printed at the end; `streaming` prints one JSON history entry per line. Entries are
`{"type": "message", "role": ..., "content": [{"type": "text", "text": ...}]}`. No
session id is printed. Usage is vibe's session `stats` (`session_prompt_tokens`,
`session_completion_tokens`, `session_cost`, as in its session `meta.json`), read wherever
a printed object carries it; a run that printed none has no usage. Vibe prints nothing
until it exits (AT_EXIT). Without an API key it exits 1 with
"Missing MISTRAL_API_KEY environment variable ... run `vibe --setup`".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
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
    usd_arg,
)
from providers.figures import Usage
from providers.parsing import Stdout, as_str

MODEL_ENV = "VIBE_ACTIVE_MODEL"  # vibe reads any config field from VIBE_<FIELD>
AUTH_FAILURE = re.compile(
    r"Missing \w*API_KEY|MISTRAL_API_KEY|vibe --setup|unauthori[sz]ed|\b401\b|invalid api key",
    re.IGNORECASE,
)


class MistralOptions(ProviderOptions):
    agent: Literal["ask", "plan", "accept-edits", "auto-approve"] | None = Field(
        default=None,
        description=(
            "Built-in agent: 'ask' and 'plan' do not change files; "
            "'accept-edits' may edit; 'auto-approve' approves every tool. Omit "
            "for the user's default."
        ),
    )
    output: Literal["text", "json", "streaming"] = Field(
        default="text",
        description=(
            "'text'; 'json' and 'streaming' print the message history "
            "(the answer is still extracted)."
        ),
    )
    trust_workspace: bool = Field(
        default=False,
        description=(
            "Trust working_dir for this run (--trust), skipping vibe's trust "
            "prompt."
        ),
    )


class MistralProvider(CliProvider):
    name: ClassVar[str] = "mistral"
    commands: ClassVar[tuple[str, ...]] = ("vibe",)
    discipline: ClassVar[OutputDiscipline] = OutputDiscipline.AT_EXIT
    login_hint: ClassVar[str] = (
        "Run `vibe --setup` (or set MISTRAL_API_KEY in [providers.mistral].env) and retry.")
    install_hint: ClassVar[str] = "uv tool install mistral-vibe (or pip install mistral-vibe)"
    options_model: ClassVar[type[ProviderOptions]] = MistralOptions
    auth_failure: ClassVar[re.Pattern[str]] = AUTH_FAILURE
    known_models: ClassVar[tuple[str, ...]] = ("mistral-medium-3.5", "devstral-2",
                                               "devstral-small")
    login_check: ClassVar[LoginCheck] = LoginCheck(files=("~/.vibe/.env",),
                                                   env_keys=("MISTRAL_API_KEY",))
    reports_cost: ClassVar[bool] = True  # session_cost

    def build_invocation(
        self, request: ProviderRequest, command: str, extra_args: list[str] | None = None,
        default_model: str | None = None,
    ) -> Invocation:
        extra = start_checks(request, extra_args)
        options = options_as(MistralOptions, request.options)
        argv = [command]
        if options.output != "text":
            argv += ["--output", options.output]
        if options.agent:
            argv += ["--agent", options.agent]
        if options.trust_workspace:
            argv.append("--trust")
        if request.max_cost_usd is not None:
            argv += ["--max-price", usd_arg(request.max_cost_usd)]
        if request.session_id:
            argv += ["--resume", request.session_id]
        argv += extra
        argv.append("--prompt=" + request.prompt)
        model = effective_model(request, default_model)
        return finish(argv, env={MODEL_ENV: model} if model else None)

    def parse_stream(self, stdout: Stdout, stderr: bytes, exit_code: int | None,
                     options: ProviderOptions | None = None) -> ProviderResult:
        stats: list[Usage] = []
        entries = (e for e in _noting_stats(stdout.json_objects(), stats)
                   if "role" in e or "content" in e)
        seen, answer = _last_assistant_text(entries)
        if not seen:
            document = stdout.json_document()
            if isinstance(document, Mapping):
                stats += [u for u in (session_usage(document),) if u is not None]
                document = document.get("history")
            if isinstance(document, list):
                answer = _last_assistant_text(document)[1]
        usage = stats[-1] if stats else None
        if answer is None:
            result = stdout_answer(exit_code)
            result.usage = usage
            return result
        return ProviderResult(text=answer, is_error=failed(exit_code), usage=usage)


def _entry_text(entry: Mapping[str, Any]) -> str:
    content = entry.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n\n".join(t for block in content if isinstance(block, Mapping)
                           and block.get("type") == "text" and (t := as_str(block.get("text"))))
    return ""


def _last_assistant_text(entries: Iterable[Any]) -> tuple[bool, str | None]:
    """(whether there was any entry, the last assistant entry's non-empty text), read one
    entry at a time: a streamed history can be as long as the whole output."""
    seen = False
    answer: str | None = None
    for entry in entries:
        seen = True
        if isinstance(entry, Mapping) and entry.get("role") == "assistant":
            answer = _entry_text(entry) or answer
    return seen, answer


def session_usage(meta: Mapping[str, Any]) -> Usage | None:
    """Usage from vibe's session stats (a `meta.json`, or a printed object with `stats`):
    `session_prompt_tokens`, `session_completion_tokens`, `session_cost`. None without any."""
    stats = meta.get("stats")
    if not isinstance(stats, Mapping):
        return None
    usage = Usage()
    for name, key in (("input_tokens", "session_prompt_tokens"),
                      ("output_tokens", "session_completion_tokens"),
                      ("cost_usd", "session_cost")):
        usage.read(name, stats.get(key))
    return usage.found()


def _noting_stats(objects: Iterable[Mapping[str, Any]],
                  found: list[Usage]) -> Iterable[Mapping[str, Any]]:
    """`objects` unchanged, appending the usage of each that carries session stats."""
    for item in objects:
        if (usage := session_usage(item)) is not None:
            found.append(usage)
        yield item
