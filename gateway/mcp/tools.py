"""The MCP tools: one request path for every provider, plus the llm_job_* family.

Every tool answers readable text and `structuredContent` (results.py); every failure
is an `isError` answer with `error_kind`, `error`, `retryable` and a text that says what to
do. No exception escapes a tool body (`guarded`): the SDK would otherwise answer only
"Error executing tool X". Tools never open the store themselves: they await the gateway's
manager, which the lifespan starts in the background so `initialize` and `tools/list`
answer at once.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import structlog
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field, ValidationError

from gateway import __version__, platform
from gateway.config import MAX_OUTPUT_BYTES_BOUND
from gateway.jobs.budgets import budget_status
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.worktrees.finish import worktree_of
from gateway.mcp.changes import change_tools
from gateway.mcp.principal import LOCAL, owned, visible_jobs
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
    JOB_ID,
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

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.jobs.manager import JobManager, Submission
    from gateway.runtime import Gateway
    from gateway.versions import CliVersions

log = structlog.get_logger(__name__)

DEFAULT_RESULT_PAGE_BYTES = 200_000  # one page of llm_job_result: comfortable in any client
# The page travels twice (text and structuredContent) in one message, and MCP clients cap
# message size (the SDK's HTTP client refuses an SSE event over 1 MiB): stay well under.
MAX_RESULT_PAGE_BYTES = 400_000
INLINE_ANSWER_BYTES = DEFAULT_RESULT_PAGE_BYTES  # a sync answer longer than this is paged
DEFAULT_WAIT_S = 30.0  # llm_job_wait's default: well under the common 60 s tool timeout
MAX_WAIT_S = 50.0  # llm_job_wait's bound: under the common 60 s client tool timeout
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 200
# gateway_status waits this long for the store like any tool's first call (runtime.py
# READY_WAIT_S): a first contact answers the real state, not "not ready".
STATUS_READY_WAIT_S = 10.0
PROGRESS_STEP = 0.001  # progress values must strictly increase between notifications



@dataclass(slots=True)
class TaskAdmission:
    """Set around a `<provider>_request` call that becomes an MCP task (task_state.py): the tool
    validates and admits exactly as a plain call, then hands the durable job over instead
    of waiting on it. One admission path, so a task and a sync call can never differ."""

    submission: Submission | None = None


TASK_ADMISSION: ContextVar[TaskAdmission | None] = ContextVar("task_admission", default=None)


class ServerState:
    """What the tools share: the settings, the running gateway (set by the lifespan) and
    the background-probed CLI versions."""

    def __init__(self, settings: Settings, role: str, setup_error: str | None = None) -> None:
        from gateway.versions import CliVersions

        self.settings = settings
        self.role = role
        # The configuration could not be loaded: the server still answers (a client that
        # sees only "connection closed" tells the user nothing), and every tool says this.
        self.setup_error = setup_error
        self.gateway: Gateway | None = None
        self.versions: CliVersions = CliVersions(settings)
        # Re-check which provider CLIs are installed; True if the tool list changed.
        self.recheck_tools: Callable[[], Awaitable[bool]] | None = None
        self.listed_providers: tuple[str, ...] = ()  # whose request tools are listed
        # Who this server's callers are (principal.py): "local" unless an HTTP gateway with
        # a token sets its own (http.py).
        self.principal = LOCAL

    async def manager(self) -> JobManager:
        """The job manager; GatewayError(unavailable) while starting or shutting down,
        (setup_error) when the setup is broken in a way no retry fixes."""
        if self.setup_error is not None:
            raise GatewayError(ErrorKind.SETUP_ERROR, self.setup_error)
        gateway = self.gateway
        if gateway is None:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               "The gateway is not running (it is starting or shutting "
                               "down). Retry in a few seconds.")
        return await gateway.manager()

    def ready_manager(self) -> JobManager | None:
        """The manager if the gateway is already up, without waiting (status reports)."""
        gateway = self.gateway
        return gateway.current_manager if gateway is not None else None


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
            return failure("internal_error",
                           f"Internal gateway error in {name}: {type(exc).__name__}: {exc}. "
                           f"Retry once; if it persists, report it with the gateway's "
                           f"stderr log.")

    return wrapper


async def _report(ctx: Context, state: dict[str, float], output_bytes: int, message: str) -> None:
    """A progress notification (a no-op unless the caller sent a progress token). Progress
    is the job's output bytes so far, made strictly increasing (the protocol wants it) by a
    tiny step when no output came; failures to notify never fail the call."""
    value = max(float(output_bytes), state["last"] + PROGRESS_STEP)
    state["last"] = value
    with contextlib.suppress(Exception):
        await ctx.report_progress(round(value, 3), None, message)


def _progress_state() -> dict[str, float]:
    return {"started": time.monotonic(), "last": -PROGRESS_STEP}


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
            max_cost_usd=values.pop("max_cost_usd", None),
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
        progress = _progress_state()
        manager = await self.state.manager()
        submission = await manager.submit(self.provider, request)
        admission = TASK_ADMISSION.get()
        if admission is not None:  # the row is durable: the caller answers with a task
            admission.submission = submission
            return ok(f"job {submission.job.id} is task {submission.job.id}",
                      job_fields(submission.job))
        job_id = submission.job.id
        await _report(ctx, progress, submission.job.output_bytes,
                      f"{self.provider} job {job_id} {submission.job.status}")

        async def on_progress(output_bytes: int, elapsed: float) -> None:
            await _report(ctx, progress, output_bytes,
                          f"{self.provider} job {job_id} running: {output_bytes} bytes of "
                          f"output after {elapsed:.0f} s")

        budget = self.state.settings.limits.sync_defer_after_s - (
            time.monotonic() - progress["started"])
        row = await manager.wait(job_id, max(0.0, budget), on_progress)
        if row.status.is_active:
            return self.deferred(row, submission.deduplicated, progress)
        return await final_answer(manager, row, submission.deduplicated)

    def deferred(self, row: JobRow, deduplicated: bool,
                 progress: dict[str, float]) -> CallToolResult:
        elapsed = time.monotonic() - progress["started"]
        text = (f"The {self.provider} job {row.id} is still {row.status} after {elapsed:.0f} s, "
                f"so this call returns now and the job keeps running in the background. Call "
                f"llm_job_wait(job_id=\"{row.id}\") (repeat until its status is no longer "
                f"queued/running), then llm_job_result(job_id=\"{row.id}\") for the answer.")
        data = {**job_fields(row), "deferred": True, "deduplicated": deduplicated,
                "reuse": reuse_of(row, deduplicated), "elapsed_s": round(elapsed, 3),
                "message": text, "next": follow_up(row)}
        return ok(text, data)


async def final_answer(manager: JobManager, row: JobRow,
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
    page = await manager.read_result(row.id, 0, INLINE_ANSWER_BYTES)
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
    hint = hints.get(ErrorKind(kind)) if kind in ErrorKind._value2member_map_ else None
    return hint or (f"See stderr_tail, or the full output with llm_job_result(job_id="
                    f"\"{row.id}\", raw=true), fix the cause and retry.")


def provider_tools(state: ServerState, name: str) -> ProviderTools:
    """The request tools of one provider: a CLI provider, or a configured HTTP API one
    (KeyError for neither). The HTTP client stack is imported only for an API provider."""
    from providers.registry import CLI_PROVIDERS

    settings = state.settings
    default_timeout = settings.limits.default_timeout_s
    api = settings.api_providers.get(name)
    if api is not None:
        from providers.http.request import ApiRequest, redact_url

        return ProviderTools(state, name, "api", option_params(ApiRequest, reserved=frozenset()),
                             api_common_params(default_timeout, name),
                             f"the {name} HTTP API ({api.kind}-compatible, "
                             f"{redact_url(api.base_url)})")
    adapter = CLI_PROVIDERS[name]
    command = adapter.commands[0] if adapter.commands else name
    return ProviderTools(state, name, "cli", option_params(adapter.options_model),
                         cli_common_params(default_timeout, name),
                         name if command == name else f"{name} (the `{command}` CLI)")


# -- job tools ------------------------------------------------------------------------------


def job_tools(state: ServerState) -> list[tuple[str, ToolBody, ToolAnnotations]]:
    """The llm_job_* tools, list_models and gateway_status."""
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    async def llm_job_status(job_id: JOB_ID) -> CallToolResult:
        """A job's status, exit code, error and output size (any gateway's)."""
        manager = await state.manager()
        row = owned(state.principal, await manager.get(job_id))
        text = describe_status(row)
        return ok(text, {**job_fields(row), "message": text, "next": follow_up(row)})

    async def llm_job_result(
        job_id: JOB_ID,
        offset: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES_BOUND, description=(
            "The previous page's next_offset."))] = 0,
        max_bytes: Annotated[int, Field(ge=1, le=MAX_RESULT_PAGE_BYTES, description=(
            "Page size in bytes."))] = DEFAULT_RESULT_PAGE_BYTES,
        raw: Annotated[bool, Field(description="Stdout instead of the answer.")] = False,
    ) -> CallToolResult:
        """A page of a job's answer (raw: its stdout), also while it runs; repeat with
        offset=next_offset until null."""
        manager = await state.manager()
        owned(state.principal, await manager.get(job_id))
        page = await manager.read_result(job_id, offset, max_bytes, raw)
        row = page.job
        # A job still running has no parsed answer yet: what it has is the CLI's stdout
        # so far (stream-json, JSONL), and the answer says so rather than `raw: false`.
        is_raw = raw or row.status.is_active
        data: dict[str, Any] = {
            **job_fields(row), "output": page.output, "offset": page.offset,
            "next_offset": page.next_offset, "complete": page.complete,
            "total_bytes": page.total_bytes, "raw": is_raw,
        }
        message: str | None = None
        still = (f"The job is still {row.status}; this is the CLI's raw output so far, not "
                 f"the answer." if row.status.is_active else "")
        if page.next_offset is not None:
            data["next"] = next_call("llm_job_result", "more output follows", job_id=row.id,
                                     offset=page.next_offset, raw=raw)
            message = (f"More output: bytes {page.offset}-{page.next_offset} of "
                       f"{page.total_bytes} shown. Call llm_job_result(job_id=\"{row.id}\", "
                       f"offset={page.next_offset}) for the next page. {still}").rstrip()
        elif row.status.is_active:
            data["next"] = follow_up(row)
            message = (f"{still} Call llm_job_wait(job_id=\"{row.id}\") and read again once "
                       f"it is done.")
        elif not page.output:
            message = f"(no output) {describe_status(row)}"
        # The model of some clients sees only the structured content: the note is there too.
        data["message"] = message
        if message is None:
            return ok(page.output, data)
        return ok(f"{page.output}\n\n[{message}]" if page.output else message, data)

    async def llm_job_cancel(job_id: JOB_ID) -> CallToolResult:
        """Stop a job wherever it runs (another gateway's within seconds)."""
        manager = await state.manager()
        owned(state.principal, await manager.get(job_id))
        outcome = await manager.cancel(job_id)
        row = outcome.job
        texts = {
            "cancelled": f"Job {row.id} is {row.status}.",
            "cancel_requested": (f"Cancel requested for job {row.id}: the gateway instance "
                                 f"that runs it will stop it within about "
                                 f"{state.settings.lease.cancel_poll_s:g} s. Check with "
                                 f"llm_job_status(job_id=\"{row.id}\")."),
            "already_terminal": f"Job {row.id} had already finished ({row.status}); "
                                f"nothing to cancel.",
        }
        text = texts.get(outcome.outcome, describe_status(row))
        data = {**job_fields(row), "outcome": outcome.outcome, "message": text,
                "next": (next_call("llm_job_status", "its owner stops it shortly",
                                   job_id=row.id)
                         if outcome.outcome == "cancel_requested" else None)}
        return ok(text, data)

    async def llm_job_wait(
        job_id: JOB_ID,
        ctx: Context,
        timeout_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description=(
            "Seconds at most (returns when it ends)."))] = DEFAULT_WAIT_S,
    ) -> CallToolResult:
        """Wait up to timeout_s for a job to end; call again while done is false."""
        progress = _progress_state()
        manager = await state.manager()

        async def on_progress(output_bytes: int, elapsed: float) -> None:
            await _report(ctx, progress, output_bytes, f"job {job_id} running: {output_bytes} "
                                                       f"bytes of output after {elapsed:.0f} s "
                                                       f"of waiting")

        owned(state.principal, await manager.get(job_id))
        row = await manager.wait(job_id, timeout_s, on_progress)
        done = row.status.is_terminal
        text = describe_status(row)
        if not done:
            text = (f"Job {row.id} is still {row.status} after waiting {timeout_s:g} s "
                    f"({row.output_bytes} bytes of output so far). Call "
                    f"llm_job_wait(job_id=\"{row.id}\") again.")
        return ok(text, {**job_fields(row), "done": done, "message": text,
                         "next": follow_up(row)})

    async def llm_job_list(
        status: Annotated[Literal["queued", "running", "completed", "failed", "cancelled",
                                  "timed_out", "orphaned"] | None,
                          Field(description="Only this status.")] = None,
        provider: Annotated[str | None, Field(description="Only this provider's.")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT, description="At most this many "
                                    "jobs.")] = DEFAULT_LIST_LIMIT,
    ) -> CallToolResult:
        """Recent jobs, newest first."""
        manager = await state.manager()
        rows = await visible_jobs(manager, state.principal, status=status, provider=provider,
                                  limit=limit)
        jobs = [job_fields(r) for r in rows]
        lines = [f"{r.id}  {r.provider:<8} {r.status:<10} {_when(r)}" for r in rows]
        text = "\n".join(lines) if lines else "No jobs match."
        return ok(text, {"jobs": jobs, "count": len(jobs)})

    async def list_models(
        provider: Annotated[str | None, Field(description="Only this provider.")] = None,
    ) -> CallToolResult:
        """Each provider's known model names and its default."""
        from providers.registry import CLI_PROVIDERS

        settings = state.settings
        catalog: dict[str, Any] = {}
        for name, config in settings.providers.items():
            adapter = CLI_PROVIDERS.get(name)
            if adapter is None or not config.enabled:
                continue
            catalog[name] = {"kind": "cli", "default_model": config.default_model,
                             "known_models": list(adapter.known_models)}
        for name, api in settings.api_providers.items():
            catalog[name] = {"kind": "api", "api_kind": api.kind,
                             "default_model": api.default_model, "known_models": []}
        if provider is not None:
            if provider not in catalog:
                raise GatewayError(ErrorKind.INVALID_INPUT,
                                   f"Unknown or disabled provider {provider!r}; known: "
                                   f"{sorted(catalog)}.")
            catalog = {provider: catalog[provider]}
        lines = []
        for name, entry in catalog.items():
            models = ", ".join(entry["known_models"]) or "(any name the API accepts)"
            default = entry["default_model"] or "the CLI's own default"
            lines.append(f"{name}: {models}; default: {default}")
        return ok("\n".join(lines), {"providers": catalog})

    async def gateway_status() -> CallToolResult:
        """Readiness (or what is broken, and the fix), jobs, limits, the store, and where
        each CLI is."""
        from providers.http.request import redact_url

        settings = state.settings
        gateway = state.gateway
        if state.recheck_tools is not None:
            await state.recheck_tools()  # a CLI installed since: list it now
        manager = None
        if gateway is not None and state.setup_error is None:
            # The first call of a session waits (bounded) for the store like any other tool:
            # "not ready" only when it really is not, with the cause.
            manager = (gateway.current_manager
                       if await gateway.wait_settled(STATUS_READY_WAIT_S) else None)
        problem = state.setup_error
        if problem is None and gateway is not None and manager is None:
            problem = gateway.not_ready_error().message
        persistence = settings.persistence
        store = (str(persistence.path) if persistence.backend == "sqlite"
                 else "postgresql (dsn not shown)" if persistence.backend == "postgres"
                 else "in memory")
        data: dict[str, Any] = {
            "version": __version__,
            "platform": platform.describe(),
            "instance_id": gateway.instance_id if gateway else None,
            "role": state.role,
            "backend": persistence.backend,
            "store": store,
            "ready": manager is not None,
            "admitting": bool(manager.snapshot()["admitting"]) if manager else False,
            "start_error": gateway.start_error if gateway else None,
            "problem": problem,
            "problem_permanent": state.setup_error is not None or bool(
                gateway is not None and gateway.failed),
            "listed_providers": list(state.listed_providers),
            "store_problem": manager.store_problem if manager else None,
            "jobs": manager.snapshot() if manager else None,
            "budgets": await budget_status(settings, manager.store) if manager else None,
            "limits": settings.limits.model_dump(mode="json"),
            "lease": settings.lease.model_dump(mode="json"),
            "connections": gateway.connection_report() if gateway else None,
            "providers": state.versions.snapshot(),
            "versions_probed": state.versions.finished.is_set(),
            "api_providers": {
                name: {"kind": api.kind, "base_url": redact_url(api.base_url),
                       "default_model": api.default_model, "api_key_env": api.api_key_env}
                for name, api in settings.api_providers.items()},
        }
        return ok(_status_text(data), data)

    return [
        ("llm_job_status", llm_job_status, read_only),
        ("llm_job_result", llm_job_result, read_only),
        ("llm_job_cancel", llm_job_cancel,
         ToolAnnotations(destructive_hint=True, idempotent_hint=True, open_world_hint=False)),
        ("llm_job_wait", llm_job_wait, read_only),
        ("llm_job_list", llm_job_list, read_only),
        ("list_models", list_models, read_only),
        ("gateway_status", gateway_status, read_only),
        *change_tools(state),
    ]


def _when(row: JobRow) -> str:
    stamp = row.finished_at or row.started_at or row.created_at
    return stamp.isoformat(timespec="seconds") if stamp else ""


def _status_text(data: dict[str, Any]) -> str:
    lines = [f"agent-cli-gateway {data['version']} instance {data['instance_id']} "
             f"({data['role']}), store: {data['backend']} {data['store']}, platform: "
             f"{data['platform']['implementation']} on {data['platform']['os']}"]
    if not data["ready"]:
        state = "BROKEN SETUP" if data["problem_permanent"] else "NOT READY YET"
        lines.append(f"{state}: {data['problem']}")
    else:
        jobs = data["jobs"] or {}
        lines.append(f"admitting: {data['admitting']}; running {jobs.get('running')}/"
                     f"{jobs.get('max_running_jobs')}, queued {jobs.get('queued')}/"
                     f"{jobs.get('max_queued_jobs')}; by provider: running "
                     f"{jobs.get('running_by_provider')}, queued {jobs.get('queued_by_provider')}")
    if data["store_problem"]:
        lines.append(f"STORE PROBLEM: {data['store_problem']}")
    lines.extend(_connections_text(data.get("connections")))
    for name, info in data["providers"].items():
        if not info["enabled"]:
            lines.append(f"  {name}: disabled")
        elif not info["found"]:
            lines.append(f"  {name}: NOT FOUND (configured command: "
                         f"{info['configured_command'] or 'default'})")
        else:
            version = info["version"] or info["version_error"] or "version not probed yet"
            lines.append(f"  {name}: {info['path']} ({version})")
    for name, api in data["api_providers"].items():
        lines.append(f"  {name}: {api['kind']} API at {api['base_url']}")
    for budget in data.get("budgets") or []:
        lines.append(f"  budget {budget['budget']}: spent {budget['spent']}, reserved "
                     f"{budget['reserved']}, left {budget['left']} of {budget['limit']} "
                     f"{budget['unit']} (resets {budget['resets_at']})")
    return "\n".join(lines)


def _connections_text(connections: dict[str, Any] | None) -> list[str]:
    """The PostgreSQL pools and the worst renewal wait: a full pool or server shows here."""
    if not connections:
        return []
    lines = []
    pools = connections.get("pool") or {}
    for name in ("work", "heartbeat"):
        if stats := pools.get(name):
            lines.append(f"  postgres {name} pool: {stats['size']}/{stats['max']} connections "
                         f"({stats['idle']} idle), {stats['waited']} waits, "
                         f"{stats['refused_connects']} refused connects, worst wait "
                         f"{stats['worst_wait_ms_1h']} ms in the last hour")
    if connections.get("renewal_pending_ms_max_1h") is not None:
        lines.append(f"  worst lease renewal wait in the last hour: "
                     f"{connections['renewal_pending_ms_max_1h']} ms")
    return lines


REQUEST_ANNOTATIONS = ToolAnnotations(open_world_hint=True, read_only_hint=False)


def request_tools(state: ServerState, name: str) -> list[Tool]:
    """`<name>_request` and `<name>_request_async`, in `tools/list` order.

    Deriving a tool from its signature (an argument model and its JSON schema) is most of a
    gateway's startup beyond the SDK's own. A provider's sync and async tools take exactly
    the same arguments, so the async one is a copy of the sync one with its own body, name
    and description: one derivation per provider instead of two.
    """
    provider = provider_tools(state, name)
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
    from gateway.mcp.usage_tools import usage_tools

    for name, body, hints in [*job_tools(state), *usage_tools(state)]:
        # One line: a docstring's indentation is bytes in every model's context.
        description = " ".join((body.__doc__ or "").split())
        wrapped = guarded(name, body)
        wrapped.__signature__ = strict_signature(body)  # type: ignore[attr-defined]
        tool = Tool.from_function(wrapped, name=name, description=description,
                                  annotations=hints)
        tool.parameters = compact_schema(tool.parameters)
        tools.append(tool)
    return tools
