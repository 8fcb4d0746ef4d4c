"""The MCP tools: one request path for every provider (`ProviderTools`), and the listing of
the llm_job_* family (its bodies are job_tools.py's `JobTools`).

Every tool answers readable text and `structuredContent` (results.py); every failure
is an `isError` answer with `error_kind`, `error`, `retryable` and a text that says what to
do. No exception escapes a tool body (`guarded`): the SDK would otherwise answer only
"Error executing tool X". Tools never open the store themselves: they await the gateway's
manager, which the lifespan starts in the background so `initialize` and `tools/list`
answer at once.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import structlog
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import ValidationError

from gateway.jobs.requests import SubmitRequest
from gateway.jobs.worktrees.finish import worktree_of
from gateway.mcp.admission import TASK_ADMISSION
from gateway.mcp.job_tools import DEFAULT_RESULT_PAGE_BYTES, JobTools
from gateway.mcp.progress import Progress
from gateway.mcp.results import (
    describe_status,
    duration_s,
    failure,
    follow_up,
    from_gateway_error,
    invalid_arguments,
    job_fields,
    next_call,
    ok,
    parsed_result,
    reuse_of,
    stderr_excerpt,
)
from gateway.mcp.signatures import (
    Param,
    api_common_params,
    cli_common_params,
    compact_schema,
    option_params,
    options_given,
    signature_of,
    strict_signature,
)
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus
from providers.registry import CLI_PROVIDERS

if TYPE_CHECKING:
    from gateway.jobs.reads import JobReads
    from gateway.mcp.server_state import ServerState

log = structlog.get_logger(__name__)

INLINE_ANSWER_BYTES = DEFAULT_RESULT_PAGE_BYTES  # a sync answer longer than this is paged




# -- error handling -------------------------------------------------------------------------

ToolBody = Callable[..., Awaitable[CallToolResult]]


def guarded(name: str, body: ToolBody) -> ToolBody:
    """Turn every failure of a tool body into an `isError` answer with an error_kind."""

    @functools.wraps(body)
    async def wrapper(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return await body(*args, **kwargs)
        except GatewayError as err:
            return from_gateway_error(err)
        except ValidationError as exc:
            return invalid_arguments(name, exc)
        except Exception as exc:
            log.exception("tool failed unexpectedly", action="tool_error", tool=name)
            return failure(ErrorKind.INTERNAL_ERROR,
                           f"Internal gateway error in {name}: {type(exc).__name__}: {exc}. "
                           f"Retry once; if it persists, report it with the gateway's "
                           f"stderr log.")

    return wrapper


# -- provider request tools ----------------------------------------------------------------


class ProviderTools:
    """`<provider>_request` and `<provider>_request_async` for one provider."""

    def __init__(self, state: ServerState, provider: str, kind: Literal["cli", "api"],
                 option_list: list[Param], common: list[Param], label: str) -> None:
        self.state = state
        self.provider = provider
        self.kind = kind
        self.options = option_list
        self.params = [*common, *option_list]
        self.label = label

    def request(self, values: dict[str, Any]) -> SubmitRequest:
        values = dict(values)
        prompt = values.pop("prompt", None)
        model = values.pop("model", None)
        return SubmitRequest(
            prompt=prompt, model=model, working_dir=values.pop("working_dir", None),
            session_id=values.pop("session_id", None), timeout_s=values.pop("timeout_s", None),
            force_refresh=bool(values.pop("force_refresh", False)),
            isolation=values.pop("isolation", None), base_ref=values.pop("base_ref", None),
            max_cost_usd=values.pop("max_cost_usd", None), runs_on=values.pop("runs_on", None),
            options=options_given(self.options, values), principal=self.state.principal)

    def make(self, sync: bool) -> ToolBody:
        name = f"{self.provider}_request" if sync else f"{self.provider}_request_async"
        run = self.run_sync if sync else self.run_async

        async def tool(**kwargs: Any) -> CallToolResult:
            ctx: Context = kwargs.pop("ctx")
            return await run(self.request(kwargs), ctx)

        signature = signature_of(self.params, Context, CallToolResult)
        tool.__signature__ = signature  # type: ignore[attr-defined]
        tool.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        tool.__annotations__["return"] = CallToolResult
        tool.__name__ = name
        tool.__qualname__ = name
        return guarded(name, tool)

    def description(self, sync: bool) -> str:
        """What a model needs to pick and call the tool, once (docs/tools.md has the rest):
        every listed tool's text is in the model's context on every turn."""
        if sync:
            defer = self.state.settings.limits.sync_defer_after_s
            return (f"Run a task on {self.label}: its answer, or after "
                    f"{defer:g} s a job_id (follow `next`).")
        return f"Start a task on {self.label}; its job_id now (follow `next`)."

    async def run_async(self, request: SubmitRequest, ctx: Context) -> CallToolResult:
        manager = await self.state.manager()
        submission = await manager.submit(self.provider, request)
        row = submission.job
        if row.status.is_active:
            self.state.watches.watch(_session_of(ctx), manager.reads, row.id)
        reuse = reuse_of(row, submission.deduplicated)
        text = (f"Started {self.provider} job {row.id}: status {row.status}. Call "
                f"llm_job_wait(job_id=\"{row.id}\") until it is done, then "
                f"llm_job_result(job_id=\"{row.id}\") for the answer.")
        if reuse is not None:
            text = f"{reuse['notice']}\n{describe_status(row)}"
        data = {**job_fields(row), "deduplicated": submission.deduplicated, "reuse": reuse,
                "message": text, "next": follow_up(row)}
        return ok(text, data)

    async def run_sync(self, request: SubmitRequest, ctx: Context) -> CallToolResult:
        progress = Progress(ctx)
        manager = await self.state.manager()
        submission = await manager.submit(self.provider, request)
        admission = TASK_ADMISSION.get()
        if admission is not None:  # the row is durable: the caller answers with a task
            admission.submission = submission
            return ok(f"job {submission.job.id} is task {submission.job.id}",
                      job_fields(submission.job))
        job_id = submission.job.id
        await progress.report(submission.job.output_bytes,
                              f"{self.provider} job {job_id} {submission.job.status}")

        async def on_progress(output_bytes: int, elapsed: float) -> None:
            await progress.report(output_bytes, f"{self.provider} job {job_id} running: "
                                                f"{output_bytes} bytes of output after "
                                                f"{elapsed:.0f} s")

        budget = self.state.settings.limits.sync_defer_after_s - progress.elapsed_s
        row = await manager.reads.wait(job_id, max(0.0, budget), on_progress)
        if row.status.is_active:
            self.state.watches.watch(_session_of(ctx), manager.reads, row.id)
            return self.deferred(row, submission.deduplicated, progress)
        return await final_answer(manager.reads, row, submission.deduplicated)

    def deferred(self, row: JobRow, deduplicated: bool,
                 progress: Progress) -> CallToolResult:
        elapsed = progress.elapsed_s
        text = (f"The {self.provider} job {row.id} is still {row.status} after {elapsed:.0f} s, "
                f"so this call returns now and the job keeps running in the background. Call "
                f"llm_job_wait(job_id=\"{row.id}\") (repeat until its status is no longer "
                f"queued/running), then llm_job_result(job_id=\"{row.id}\") for the answer.")
        data = {**job_fields(row), "deferred": True, "deduplicated": deduplicated,
                "reuse": reuse_of(row, deduplicated), "elapsed_s": round(elapsed, 3),
                "message": text, "next": follow_up(row)}
        return ok(text, data)


def _session_of(ctx: Context) -> Any:
    """The caller's session, or None when the request has none (it may have none outside a
    request's context)."""
    try:
        return ctx.session
    except Exception:
        return None


async def final_answer(reads: JobReads, row: JobRow,
                       deduplicated: bool = False) -> CallToolResult:
    """A terminal job as the sync tool's answer: the reply text, or an isError. Also an
    MCP task's result (task_state.py): the one place that answer is built."""
    parsed = parsed_result(row) or {}
    reuse = reuse_of(row, deduplicated)
    common = {
        "job_id": row.id, "status": str(row.status), "provider": row.provider,
        "model": row.model, "session_id": parsed.get("session_id"),
        "native_session_id": parsed.get("session_id"), "usage": parsed.get("usage"),
        "exit_code": row.exit_code, "duration_s": duration_s(row, parsed),
        "error_kind": row.error_kind, "error": row.error, "deduplicated": deduplicated,
        "reuse": reuse, "output_bytes": row.output_bytes, "truncated": row.truncated,
        "worktree": worktree_of(row.request_json, row.result_json),
    }
    replayed = f"[{reuse['notice']}]\n\n" if reuse is not None else ""
    if row.status != JobStatus.COMPLETED:
        kind = row.error_kind or (ErrorKind.CANCELLED if row.status == JobStatus.CANCELLED
                                  else ErrorKind.PROVIDER_ERROR)
        message = row.error or f"the job ended {row.status}"
        hint = _next_step(kind, row)
        text = (f"{replayed}The {row.provider} job {row.id} {row.status} ({kind}): "
                f"{message}\n{hint}")
        common.pop("error_kind")
        common.pop("error")
        return failure(kind, message, text=text, **common, what_to_do=hint,
                       stderr_tail=stderr_excerpt(row))
    page = await reads.read_result(row.id, 0, INLINE_ANSWER_BYTES, terminal=row)
    rest = None
    if page.next_offset is not None:
        rest = next_call("llm_job_result", "the answer is longer than this page",
                         job_id=row.id, offset=page.next_offset)
    common.update(text=page.output, text_bytes=page.total_bytes,
                  text_complete=page.next_offset is None, next_offset=page.next_offset,
                  next=rest)
    text = page.output if page.output else "(the provider returned an empty answer)"
    if page.next_offset is not None:
        text += (f"\n\n[The answer is {page.total_bytes} bytes; this is the first "
                 f"{page.next_offset}. Read the rest with llm_job_result(job_id=\"{row.id}\", "
                 f"offset={page.next_offset}).]")
    return ok(replayed + text, common)


def _next_step(kind: str, row: JobRow) -> str:
    hints = {
        ErrorKind.AUTH: "Log the CLI in as the message says, then retry the request.",
        ErrorKind.TIMEOUT: "Raise timeout_s or split the task, then retry.",
        ErrorKind.IDLE_TIMEOUT: "The CLI printed nothing for too long; retry, or raise "
                                "limits.idle_timeout_s in the gateway config.",
        ErrorKind.OUTPUT_LIMIT: "The output exceeded limits.max_output_bytes; ask for less "
                                "output or raise the limit.",
        ErrorKind.CANCELLED: "It was cancelled; submit it again if you still need it.",
        ErrorKind.SHUTDOWN: "The gateway shut down; submit the request again.",
        ErrorKind.QUEUE_TIMEOUT: "The gateway was busy; retry in a little while.",
        ErrorKind.NOT_FOUND: "Install the CLI or set [providers.<name>].command to its path.",
        ErrorKind.ORPHANED: "Its gateway instance went away; submit the request again.",
    }
    known = ErrorKind.of(kind)
    hint = hints.get(known) if known is not None else None
    return hint or (f"See stderr_tail, or the full output with llm_job_result(job_id="
                    f"\"{row.id}\", raw=true), fix the cause and retry.")


def provider_tools(state: ServerState, name: str, remote_only: bool = False) -> ProviderTools:
    """The request tools of one provider: a CLI provider, or a configured HTTP API one
    (KeyError for neither). The HTTP client stack is imported only for an API provider.
    `remote_only`: a CLI only a live worker has; its runs_on defaults to "any"."""
    settings = state.settings
    default_timeout = settings.limits.default_timeout_s
    api = settings.api_providers.get(name)
    if api is not None:
        from providers.http.request import ApiRequest, redact_url  # deferred: start-up

        return ProviderTools(state, name, "api", option_params(ApiRequest, reserved=frozenset()),
                             api_common_params(default_timeout, name),
                             f"the {name} HTTP API ({api.kind}-compatible, "
                             f"{redact_url(api.base_url)})")
    adapter = CLI_PROVIDERS[name]
    command = adapter.commands[0] if adapter.commands else name
    return ProviderTools(state, name, "cli", option_params(adapter.options_model),
                         cli_common_params(default_timeout, name,
                                           "any" if remote_only else None),
                         name if command == name else f"{name} (the `{command}` CLI)")


REQUEST_ANNOTATIONS = ToolAnnotations(open_world_hint=True, read_only_hint=False)


def request_tools(state: ServerState, name: str, remote_only: bool = False) -> list[Tool]:
    """`<name>_request` and `<name>_request_async`, in `tools/list` order.

    Deriving a tool from its signature (an argument model and its JSON schema) is most of a
    gateway's startup beyond the SDK's own. A provider's sync and async tools take exactly
    the same arguments, so the async one is a copy of the sync one with its own body, name
    and description: one derivation per provider instead of two.
    """
    provider = provider_tools(state, name, remote_only)
    sync_body, async_body = provider.make(sync=True), provider.make(sync=False)
    sync_tool = Tool.from_function(sync_body, name=sync_body.__name__,
                                   description=provider.description(sync=True),
                                   annotations=REQUEST_ANNOTATIONS)
    sync_tool.parameters = compact_schema(sync_tool.parameters)
    async_tool = sync_tool.model_copy(update={
        "fn": async_body, "name": async_body.__name__,
        "description": provider.description(sync=False),
        "parameters": dict(sync_tool.parameters)})  # its own dict: the server sets keys on it
    return [sync_tool, async_tool]


def build_job_tools(state: ServerState) -> list[Tool]:
    """The llm_job_* tools, list_models and gateway_status, always listed."""
    tools = []
    # Built at the first tools/list: not loaded before initialize is answered.
    from gateway.mcp.attempt_tools import attempt_tools  # deferred: start-up
    from gateway.mcp.usage_tools import usage_tools  # deferred: start-up

    for name, body, hints in [*JobTools(state).tools(), *usage_tools(state),
                              *attempt_tools(state)]:
        # One line: a docstring's indentation is bytes in every model's context.
        description = " ".join((body.__doc__ or "").split())
        wrapped = guarded(name, body)
        wrapped.__signature__ = strict_signature(body)  # type: ignore[attr-defined]
        tool = Tool.from_function(wrapped, name=name, description=description,
                                  annotations=hints)
        tool.parameters = compact_schema(tool.parameters)
        tools.append(tool)
    return tools
