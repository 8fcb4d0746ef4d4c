"""The llm_job_* tools, list_models and gateway_status: always listed, whatever is installed.

Each tool is a method of `JobTools`; its docstring is the tool's description and its
signature the input schema (tools.build_job_tools derives both), so a docstring or an
annotation here is bytes in every calling model's context (tests/mcp/test_listing.py).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gateway import __version__, platform
from gateway.config import MAX_OUTPUT_BYTES_BOUND
from gateway.jobs.budgets import budget_status
from gateway.mcp.admission import MAX_WAIT_S
from gateway.mcp.changes import change_tools
from gateway.mcp.principal import owned, visible_jobs
from gateway.mcp.progress import Progress
from gateway.mcp.results import describe_status, follow_up, job_fields, next_call, ok
from gateway.mcp.signatures import JOB_ID
from gateway.model import ErrorKind, GatewayError, JobRow
from gateway.store.base import JobStore, StoreUnavailable
from providers.registry import CLI_PROVIDERS

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.config import Settings
    from gateway.jobs.manager import JobManager
    from gateway.mcp.server_state import ServerState

    ToolBody = Callable[..., Awaitable[CallToolResult]]

DEFAULT_RESULT_PAGE_BYTES = 200_000  # one page of llm_job_result: comfortable in any client
# The page travels twice (text and structuredContent) in one message, and MCP clients cap
# message size (the SDK's HTTP client refuses an SSE event over 1 MiB): stay well under.
MAX_RESULT_PAGE_BYTES = 400_000
DEFAULT_WAIT_S = 30.0  # llm_job_wait's default: well under the common 60 s tool timeout
MAX_WAIT_JOBS = 50  # llm_job_wait's job_ids: one wait task and one read each
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 200
# gateway_status waits this long for the store like any tool's first call (runtime.py
# READY_WAIT_S): a first contact answers the real state, not "not ready".
STATUS_READY_WAIT_S = 10.0

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CANCEL_ANNOTATIONS = ToolAnnotations(destructive_hint=True, idempotent_hint=True,
                                     open_world_hint=False)


class JobTools:
    """The tool bodies over one server's state: every job they touch is the caller's own
    (principal.py); reads go through the gateway's JobReads, a cancel through its manager."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def llm_job_status(self, job_id: JOB_ID) -> CallToolResult:
        """A job's status, exit code, error."""
        reads = await self.state.reads()
        row = owned(self.state.principal, await reads.get(job_id))
        text = describe_status(row)
        return ok(text, {**job_fields(row), "message": text, "next": follow_up(row)})

    async def llm_job_result(
        self,
        job_id: JOB_ID,
        offset: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES_BOUND, description=(
            "next_offset"))] = 0,
        max_bytes: Annotated[int, Field(ge=1, le=MAX_RESULT_PAGE_BYTES, description=(
            "Bytes"))] = DEFAULT_RESULT_PAGE_BYTES,
        raw: Annotated[bool, Field(description="Stdout, not the answer.")] = False,
    ) -> CallToolResult:
        """A page of a job's answer, also while it runs; repeat with next_offset."""
        reads = await self.state.reads()
        seen = owned(self.state.principal, await reads.get(job_id))
        # A finished job's page is read with the row just read (one store read, not two).
        page = await reads.read_result(job_id, offset, max_bytes, raw, terminal=seen)
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

    async def llm_job_cancel(self, job_id: JOB_ID) -> CallToolResult:
        """Stop a job wherever it runs (in seconds)."""
        manager = await self.state.manager()
        owned(self.state.principal, await manager.reads.get(job_id))
        outcome = await manager.cancel(job_id)
        row = outcome.job
        texts = {
            "cancelled": f"Job {row.id} is {row.status}.",
            "cancel_requested": (f"Cancel requested for job {row.id}: the gateway instance "
                                 f"that runs it will stop it within about "
                                 f"{self.state.settings.lease.cancel_poll_s:g} s. Check with "
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
        self,
        ctx: Context,
        job_id: Annotated[str | None, Field(description="A job_id.")] = None,
        job_ids: Annotated[list[str] | None, Field(description="Or these.")] = None,
        mode: Annotated[Literal["any", "all"], Field(description="For job_ids.")] = "any",
        timeout_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description=(
            "Seconds at most."))] = DEFAULT_WAIT_S,
    ) -> CallToolResult:
        """Wait for job_id, or any/all job_ids, to end; repeat until done."""
        if (job_id is None) == (job_ids is None):
            raise GatewayError(ErrorKind.INVALID_INPUT,
                               "Give job_id (one job) or job_ids (several, with mode "
                               "\"any\" or \"all\"), not both and not neither.")
        if job_ids is not None:
            if not 0 < len(job_ids) <= MAX_WAIT_JOBS:
                raise GatewayError(ErrorKind.INVALID_INPUT,
                                   f"job_ids takes 1 to {MAX_WAIT_JOBS} ids; wait on fewer "
                                   f"at a time.")
            return await self._wait_many(ctx, list(dict.fromkeys(job_ids)), mode, timeout_s)
        assert job_id is not None
        progress = Progress(ctx)
        reads = await self.state.reads()

        async def on_progress(output_bytes: int, elapsed: float) -> None:
            await progress.report(output_bytes, f"job {job_id} running: {output_bytes} bytes "
                                                f"of output after {elapsed:.0f} s of waiting")

        seen = owned(self.state.principal, await reads.get(job_id))
        row = await reads.wait(job_id, timeout_s, on_progress, read=seen)
        done = row.status.is_terminal
        text = describe_status(row)
        if not done:
            text = (f"Job {row.id} is still {row.status} after waiting {timeout_s:g} s "
                    f"({row.output_bytes} bytes of output so far). Call "
                    f"llm_job_wait(job_id=\"{row.id}\") again.")
        return ok(text, {**job_fields(row), "done": done, "message": text,
                         "next": follow_up(row)})

    async def _wait_many(self, ctx: Context, job_ids: list[str], mode: str,
                         timeout_s: float) -> CallToolResult:
        """llm_job_wait over several jobs: `done` once any (or all) ended, whichever
        gateway ended them; `ended` names the ended ones, `jobs` has each one's fields."""
        progress = Progress(ctx)
        reads = await self.state.reads()
        seen = [owned(self.state.principal, await reads.get(one)) for one in job_ids]

        async def on_progress(output_bytes: int, elapsed: float) -> None:
            await progress.report(output_bytes, f"{len(job_ids)} jobs: still waiting after "
                                                f"{elapsed:.0f} s")

        rows = await reads.wait_many(seen, mode == "all", timeout_s, on_progress)
        ended = [row.id for row in rows if row.status.is_terminal]
        done = len(ended) == len(rows) if mode == "all" else bool(ended)
        lines = [describe_status(row) for row in rows if row.status.is_terminal]
        if done:
            text = "\n".join(lines)
        else:
            text = "\n".join([f"{len(ended)} of {len(rows)} jobs ended after waiting "
                              f"{timeout_s:g} s (mode {mode}); call llm_job_wait(job_ids=...) "
                              f"again.", *lines])
        waiting = [row.id for row in rows if row.status.is_active]
        data = {"done": done, "mode": mode, "ended": ended, "waiting": waiting,
                "jobs": [{**job_fields(row), "next": follow_up(row)} for row in rows],
                "message": text,
                "next": (next_call("llm_job_wait", "wait for the rest", job_ids=waiting,
                                   mode=mode) if waiting and (mode == "all" or not done)
                         else None)}
        return ok(text, data)

    async def llm_job_list(
        self,
        status: Annotated[Literal["queued", "running", "completed", "failed", "cancelled",
                                  "timed_out", "orphaned"] | None,
                          Field(description="Only this status.")] = None,
        provider: Annotated[str | None, Field(description="Only this provider's.")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT, description="At most.")] = DEFAULT_LIST_LIMIT,
    ) -> CallToolResult:
        """Recent jobs, newest first."""
        rows = await visible_jobs(await self.state.reads(), self.state.principal, status=status,
                                  provider=provider, limit=limit)
        jobs = [job_fields(r) for r in rows]
        lines = [f"{r.id}  {r.provider:<8} {r.status:<10} {_when(r)}" for r in rows]
        text = "\n".join(lines) if lines else "No jobs match."
        return ok(text, {"jobs": jobs, "count": len(jobs)})

    async def list_models(
        self,
        provider: Annotated[str | None, Field(description="Only this provider.")] = None,
    ) -> CallToolResult:
        """Each provider's models and default."""
        settings = self.state.settings
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

    async def gateway_status(self) -> CallToolResult:
        """Readiness, or the problem and its fix."""
        # providers/http/: not loaded before tools/list is answered.
        from providers.http.request import redact_url  # deferred: start-up

        settings = self.state.settings
        gateway = self.state.gateway
        manager = None
        if gateway is not None and self.state.setup_error is None:
            # The first call of a session waits (bounded) for the store like any other tool:
            # "not ready" only when it really is not, with the cause.
            manager = (gateway.current_manager
                       if await gateway.wait_settled(STATUS_READY_WAIT_S) else None)
        if self.state.recheck_tools is not None:
            # A CLI installed since, or a worker that has one (read from the store once it
            # is open): list it now.
            await self.state.recheck_tools()
        problem = self.state.setup_error
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
            "role": self.state.role,
            "backend": persistence.backend,
            "store": store,
            "ready": manager is not None,
            "admitting": bool(manager.snapshot()["admitting"]) if manager else False,
            "start_error": gateway.start_error if gateway else None,
            "problem": problem,
            "problem_permanent": self.state.setup_error is not None or bool(
                gateway is not None and gateway.failed),
            "listed_providers": list(self.state.listed_providers),
            "store_problem": manager.store_problem if manager else None,
            "jobs": manager.snapshot() if manager else None,
            "budgets": await budget_status(settings, manager.store) if manager else None,
            "workers": await _workers(manager.store) if manager else [],
            "notices": await _notices_status(settings, manager),
            "limits": settings.limits.model_dump(mode="json"),
            "lease": settings.lease.model_dump(mode="json"),
            "connections": gateway.connection_report() if gateway else None,
            "providers": self.state.versions.snapshot(),
            "versions_probed": self.state.versions.finished.is_set(),
            "api_providers": {
                name: {"kind": api.kind, "base_url": redact_url(api.base_url),
                       "default_model": api.default_model, "api_key_env": api.api_key_env}
                for name, api in settings.api_providers.items()},
        }
        return ok(_status_text(data), data)

    def tools(self) -> list[tuple[str, ToolBody, ToolAnnotations]]:
        """[(name, body, annotations)] in `tools/list` order, `llm_job_changes` included."""
        return [
            ("llm_job_status", self.llm_job_status, READ_ONLY),
            ("llm_job_result", self.llm_job_result, READ_ONLY),
            ("llm_job_cancel", self.llm_job_cancel, CANCEL_ANNOTATIONS),
            ("llm_job_wait", self.llm_job_wait, READ_ONLY),
            ("llm_job_list", self.llm_job_list, READ_ONLY),
            ("list_models", self.list_models, READ_ONLY),
            ("gateway_status", self.gateway_status, READ_ONLY),
            *change_tools(self.state),
        ]


async def _notices_status(settings: Settings, manager: JobManager | None) -> dict[str, Any]:
    """The `[notify]` sinks on and how many notices ended failed (None: store unreadable)."""
    failed = None
    if manager is not None:
        with contextlib.suppress(StoreUnavailable):
            failed = await manager.store.count_failed_notices()
    return {"sinks": settings.notify.sinks, "failed": failed}


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
    notices = data.get("notices") or {}
    if notices.get("failed"):
        lines.append(f"NOTICES FAILED: {notices['failed']} completion notices could not be "
                     f"delivered (`agent-cli-gateway notices --failed` lists them)")
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


async def _workers(store: JobStore) -> list[dict[str, Any]]:
    """The live instances that published capabilities (worker hosts, issue 42), with them:
    where a job with runs_on can go. Empty on one host (SQLite, memory)."""
    if store.backend != "postgres":
        return []
    try:
        rows, now = await store.list_instances(), await store.now()
    except StoreUnavailable:
        return []
    workers = []
    for row in rows:
        if row.capabilities is None or row.stopped_at is not None:
            continue
        if row.lease_expires_at is None or row.lease_expires_at.timestamp() < now:
            continue
        try:
            caps = json.loads(row.capabilities)
        except ValueError:
            continue
        workers.append({"instance_id": row.instance_id, "hostname": row.hostname,
                        "capabilities": caps})
    return workers
