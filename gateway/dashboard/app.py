"""The dashboard's routes: pages rendered on the server from the store, the live streams, and
the actions (only with --allow-actions), each through the code path its MCP tool and CLI
command use.

Pages: Jobs (`/`), Job (`/jobs/{id}`), Attempts (`/attempts`, `/attempts/{group}`: attempts.py
builds them), Usage (`/usage`), Gateways (`/gateways`). A page is added with one route and one
entry in NAV.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
import structlog
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway import proc
from gateway.config import Settings
from gateway.dashboard import attempts, charts, live, views
from gateway.dashboard.auth import COOKIE_NAME, TOKEN_PARAM, Sessions
from gateway.dashboard.guard import DashboardGuard
from gateway.jobs.budgets import budget_status
from gateway.jobs.on_read import finalize_on_read, instance_lease_state
from gateway.jobs.usage_report import usage_report
from gateway.jobs.worktrees import changes
from gateway.jobs.worktrees.create import plan_of
from gateway.model import ACTIVE_STATUSES, GatewayError, JobRow, JobStatus
from gateway.store.base import JobsPage, JobStore, StoreUnavailable
from neutral.host_origin import HostOriginRule
from providers.registry import CLI_PROVIDERS

log = structlog.get_logger(__name__)

HERE = Path(__file__).parent
STATIC_FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
PAGE_ROWS = 50  # rows of the jobs table per page
DIFF_MAX_BYTES = 400_000  # a worktree diff shown on the job page (the rest: `jobs diff`)
ANSWER_MAX_BYTES = 256 * 1024  # a finished job's answer shown on its page
USAGE_DAYS = 30  # the usage page's window
OWNED_COUNT_LIMIT = 100_000  # active jobs counted per instance (as `instances` counts)
NAV = (("/", "Jobs"), ("/attempts", "Attempts"), ("/usage", "Usage"), ("/gateways", "Gateways"))
NOTICES = {"cancel": "Cancel requested: the owning gateway stops the job within its "
                     "cancel poll.",
           "apply": "The job's changes were applied to its checkout as uncommitted edits.",
           "discard": "The job's worktree and branch were discarded."}

StoreSource = Callable[[], Awaitable[JobStore]]


@dataclass(frozen=True, slots=True)
class DashboardOptions:
    settings: Settings
    store: StoreSource  # the store to read (raises StoreUnavailable while there is none)
    sessions: Sessions
    allow_actions: bool = False
    prefix: str = ""  # "/ui" under serve; "" on its own listener


def _environment(prefix: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.globals["base"] = prefix
    env.globals["nav"] = NAV
    env.globals["statuses"] = [s.value for s in JobStatus]
    return env


def build_dashboard_app(options: DashboardOptions, rule: HostOriginRule | None) -> ASGIApp:
    """The dashboard as an ASGI app behind its guard. `rule` None: the caller checked
    Host/Origin already (serve's HttpGuard in front of `/ui`)."""
    env = _environment(options.prefix)
    pages = Pages(options, env)
    routes = [
        Route("/", pages.jobs), Route("/jobs/{job_id}", pages.job),
        Route("/attempts", pages.attempt_groups),
        Route("/attempts/{group_id}", pages.attempt_group),
        Route("/attempts/{group_id}/pick", pages.pick, methods=["POST"]),
        Route("/usage", pages.usage), Route("/gateways", pages.gateways),
        Route("/events/jobs", pages.jobs_events),
        Route("/events/jobs/{job_id}", pages.job_events),
        Route("/jobs/{job_id}/{action}", pages.act, methods=["POST"]),
        Route("/static/{name}", pages.static),
    ]
    app = Starlette(routes=routes)
    return DashboardGuard(Authenticated(app, options, env), rule, options.prefix)


class Authenticated:
    """Token exchange and the session cookie in front of every route but the static files."""

    def __init__(self, app: ASGIApp, options: DashboardOptions, env: jinja2.Environment) -> None:
        self.app = app
        self.options = options
        self.env = env

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        sessions = self.options.sessions
        offered = request.query_params.get(TOKEN_PARAM)
        has_session = sessions.csrf_of(request.cookies.get(COOKIE_NAME)) is not None
        if has_session and offered is None:
            await self.app(scope, receive, send)
            return
        # A token to trade (a session already open keeps its cookie: the printed address
        # opened again in the same browser is not refused for a spent token); or, with no
        # token guarding the listener, a session for the asking.
        session = None
        if not has_session:
            session = (sessions.exchange(offered) if offered is not None
                       else sessions.open_without_token())
            if session is None:
                await self._refuse(scope, receive, send)
                return
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAM]
        target = self.options.prefix + scope["path"] + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)  # the token leaves the address
        if session is not None:
            response.set_cookie(COOKIE_NAME, session, httponly=True, samesite="strict",
                                path=self.options.prefix or "/")
        await response(scope, receive, send)

    async def _refuse(self, scope: Any, receive: Any, send: Any) -> None:
        html = self.env.get_template("unauthorized.html").render()
        await HTMLResponse(html, status_code=401)(scope, receive, send)


class Pages:
    def __init__(self, options: DashboardOptions, env: jinja2.Environment) -> None:
        self.options = options
        self.settings = options.settings
        self.env = env

    def _render(self, request: Request, name: str, status_code: int = 200,
                **context: Any) -> HTMLResponse:
        csrf = self.options.sessions.csrf_of(request.cookies.get(COOKIE_NAME)) or ""
        html = self.env.get_template(name).render(
            csrf=csrf, allow_actions=self.options.allow_actions, path=request.url.path,
            **context)
        return HTMLResponse(html, status_code=status_code)

    async def _store(self, request: Request) -> JobStore | Response:
        try:
            return await self.options.store()
        except StoreUnavailable as exc:
            return self._render(request, "error.html", 503,
                                title="The job store is not available",
                                message=f"{exc} Reload in a few seconds.")

    # -- jobs ------------------------------------------------------------------------
    def _page(self, request: Request) -> tuple[JobsPage, dict[str, str]]:
        params = request.query_params
        status = params.get("status") or ""
        chosen = ({s for s in JobStatus if s.value == status} if status != "active"
                  else set(ACTIVE_STATUSES))
        filters = {"status": status if chosen else "", "provider": params.get("provider") or "",
                   "host": params.get("host") or ""}
        page = JobsPage(statuses=tuple(sorted(chosen)) if chosen else None,
                        provider=filters["provider"] or None, hostname=filters["host"] or None,
                        after_id=params.get("after") or None, limit=PAGE_ROWS)
        return page, filters

    def _rows_html(self, rows: list[JobRow], now: float) -> Markup:
        """The table's rows: HTML the template escaped, so the page embeds it as it is."""
        return Markup(self.env.get_template("job_rows.html").render(
            lines=[views.job_line(row, now) for row in rows]))

    async def jobs(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        page, filters = self._page(request)
        rows = await store.list_jobs_page(page)
        now = await store.now()
        hosts = sorted({i.hostname for i in await store.list_instances()} |
                       ({filters["host"]} if filters["host"] else set()))
        providers = sorted({*CLI_PROVIDERS, *self.settings.api_providers})
        query = {k: v for k, v in filters.items() if v}
        next_query = (urlencode({**query, "after": rows[-1].id})
                      if len(rows) == PAGE_ROWS else None)
        live_query = urlencode({**query, **({"after": page.after_id} if page.after_id else {})})
        return self._render(request, "jobs.html", title="Jobs", filters=filters, hosts=hosts,
                            providers=providers, rows_html=self._rows_html(rows, now),
                            next_query=next_query, first_query=urlencode(query),
                            paged=page.after_id is not None, live_query=live_query)

    async def jobs_events(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        page, _ = self._page(request)
        return _sse(live.jobs_stream(store, page, self._rows_html, request.is_disconnected))

    # -- one job ---------------------------------------------------------------------
    def _status_html(self, row: JobRow, now: float) -> Markup:
        return Markup(self.env.get_template("job_status.html").render(
            job=views.job_detail(row, now)))

    async def job(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        job_id = request.path_params["job_id"]
        row = await store.get_job(job_id, with_output=False)
        if row is None:
            return self._render(request, "error.html", 404, title="No such job",
                                message=f"No job {views.shown(job_id)!r} in this store.")
        # As the operator commands read: a run that ended while no gateway watched is
        # finalized first, so the page shows its true end.
        row = await finalize_on_read(self.settings, store, row)
        now = await store.now()
        answer = ""
        if row.status.is_terminal:
            found = await store.read_output(row.id, 0, ANSWER_MAX_BYTES, answer=True)
            answer = views.shown(found[0].decode("utf-8", errors="replace")) if found else ""
        diff, diff_error = await self._diff(row)
        notice = NOTICES.get(request.query_params.get("done") or "", "")
        return self._render(request, "job.html", title=f"Job {row.id[:8]}",
                            job=views.job_detail(row, now), job_id=row.id,
                            status_html=self._status_html(row, now), answer=answer,
                            diff=diff, diff_error=diff_error, notice=notice,
                            can_change=diff is not None and bool(diff))

    async def _diff(self, row: JobRow) -> tuple[list[views.DiffFile] | None, str]:
        """The worktree diff per file (None: not an isolated job), or why there is none."""
        if plan_of(row.request_json) is None:
            return None, ""
        try:
            page = await asyncio.to_thread(changes.diff, row, proc.hostname(), "patch", 0,
                                           DIFF_MAX_BYTES)
        except GatewayError as exc:
            return [], views.shown(exc.message)
        return views.diff_files(page.text), ""

    async def job_events(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        return _sse(live.job_stream(self.settings, store, request.path_params["job_id"],
                                    self._status_html, request.is_disconnected))

    # -- attempt groups --------------------------------------------------------------
    async def attempt_groups(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        return self._render(request, "attempts.html", title="Attempts",
                            groups=await attempts.group_lines(store))

    async def attempt_group(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        group_id = request.path_params["group_id"]
        group = await store.get_attempt_group(group_id)
        if group is None:
            return self._render(request, "error.html", 404, title="No such attempt group",
                                message=f"No attempt group {views.shown(group_id)!r} in "
                                        "this store.")
        notice = attempts.DONE.get(request.query_params.get("done") or "", "")
        return self._render(request, "attempt_group.html", title=f"Group {group_id[:8]}",
                            page=await attempts.group_page(store, group), notice=notice)

    async def pick(self, request: Request) -> Response:
        """apply / keep / discard of a group: llm_attempts_pick's code (attempts.do_pick),
        a POST with the session's CSRF token, only with --allow-actions."""
        body = await self._allowed_form(request)
        if isinstance(body, Response):
            return body
        action = (body.get("action") or [""])[0]
        job_id = (body.get("job_id") or [""])[0] or None
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        group_id = request.path_params["group_id"]
        group = await store.get_attempt_group(group_id)
        if group is None:
            return self._render(request, "error.html", 404, title="No such attempt group",
                                message=f"No attempt group {views.shown(group_id)!r} in "
                                        "this store.")
        try:
            await attempts.do_pick(self.settings, store, group, job_id, action)
        except GatewayError as exc:
            return self._render(request, "error.html", 409, title="Could not pick",
                                message=views.shown(exc.message))
        log.info("dashboard action", action=f"dashboard_pick_{action}", group_id=group_id,
                 job_id=job_id)
        return RedirectResponse(f"{self.options.prefix}/attempts/{group_id}?done={action}",
                                status_code=303)

    # -- actions ---------------------------------------------------------------------
    async def _allowed_form(self, request: Request) -> dict[str, list[str]] | Response:
        """The POSTed form, or the refusal: actions not allowed, or a CSRF token that is
        not the session's."""
        if not self.options.allow_actions:
            return self._render(request, "error.html", 403, title="Read-only dashboard",
                                message="This dashboard was started without "
                                        "--allow-actions: it changes nothing.")
        body = parse_qs((await request.body()).decode("utf-8", errors="replace"))
        offered = (body.get("csrf") or [""])[0]
        if not self.options.sessions.csrf_matches(request.cookies.get(COOKIE_NAME), offered):
            return self._render(request, "error.html", 403, title="Refused",
                                message="The form's CSRF token is missing or stale: reload "
                                        "the page and try again.")
        return body

    async def act(self, request: Request) -> Response:
        """cancel, apply, discard: POST with the session's CSRF token, only with
        --allow-actions; the same code as `jobs cancel` and `llm_job_changes`."""
        body = await self._allowed_form(request)
        if isinstance(body, Response):
            return body
        action = request.path_params["action"]
        if action not in NOTICES:
            return self._render(request, "error.html", 404, title="No such action",
                                message="The actions are cancel, apply and discard.")
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        job_id = request.path_params["job_id"]
        row = await store.get_job(job_id, with_output=False)
        if row is None:
            return self._render(request, "error.html", 404, title="No such job",
                                message=f"No job {views.shown(job_id)!r} in this store.")
        try:
            if action == "cancel":
                await store.request_cancel(row.id)
            elif action == "apply":
                await asyncio.to_thread(changes.apply, row, proc.hostname())
            else:
                await asyncio.to_thread(changes.discard, row, proc.hostname())
        except GatewayError as exc:
            return self._render(request, "error.html", 409, title=f"Could not {action}",
                                message=views.shown(exc.message))
        log.info("dashboard action", action=f"dashboard_{action}", job_id=row.id)
        return RedirectResponse(f"{self.options.prefix}/jobs/{row.id}?done={action}",
                                status_code=303)

    # -- usage and gateways ----------------------------------------------------------
    async def usage(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        since = (datetime.now(UTC).date() - timedelta(days=USAGE_DAYS - 1)).isoformat()
        by_day = await usage_report(store, "day", since)
        by_provider = await usage_report(store, "provider", since)
        budgets = await budget_status(self.settings, store)
        cost_chart = charts.bar_chart("Cost per day (USD)", [
            (str(g["day"])[5:], float(g["cost_usd"] or 0)) for g in by_day["groups"]], "$")
        token_chart = charts.bar_chart("Tokens per day (input + output)", [
            (str(g["day"])[5:], float((g["input_tokens"] or 0) + (g["output_tokens"] or 0)))
            for g in by_day["groups"]])
        provider_chart = charts.bar_chart("Cost per provider (USD)", [
            (views.shown(str(g["provider"])), float(g["cost_usd"] or 0))
            for g in by_provider["groups"]], "$")
        return self._render(request, "usage.html", title="Usage", since=since,
                            charts=[cost_chart, token_chart, provider_chart],
                            providers=by_provider, budgets=budgets)

    async def gateways(self, request: Request) -> Response:
        store = await self._store(request)
        if isinstance(store, Response):
            return store
        now = await store.now()
        instances = await store.list_instances()
        hosts: dict[str, list[views.InstanceLine]] = {}
        for instance in instances:
            owned = await store.list_jobs(statuses=sorted(ACTIVE_STATUSES),
                                          owner_instance=instance.instance_id,
                                          limit=OWNED_COUNT_LIMIT, with_output=False)
            line = views.instance_line(instance, instance_lease_state(instance, now),
                                       len(owned), now)
            hosts.setdefault(line.hostname, []).append(line)
        waits = [i.renewal_wait_ms_max_1h for i in instances
                 if i.renewal_wait_ms_max_1h is not None]
        worst = f"{max(waits):.0f} ms" if waits else "not measured yet"
        return self._render(request, "gateways.html", title="Gateways", hosts=hosts,
                            worst_renewal=worst)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return Response(status_code=404)
        return FileResponse(HERE / "static" / name, media_type=STATIC_FILES[name])


def _sse(stream: Any) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
