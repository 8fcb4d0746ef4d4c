"""The dashboard's routes in this process (so the coverage run measures them): the real app
over a real SQLite store that a real gateway writes, asked over ASGI by an HTTP client. The
browser tests (test_dashboard_browser.py) drive the same app as a process."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.dashboard import live
from gateway.dashboard.app import PAGE_ROWS, DashboardOptions, build_dashboard_app
from gateway.dashboard.auth import COOKIE_NAME, Sessions
from gateway.dashboard.serve import DashboardRun, serve_dashboard
from gateway.jobs.requests import SubmitRequest
from gateway.model import JobStatus, NewJob
from gateway.runtime import Gateway
from gateway.store import open_store
from gateway.store.base import JobsPage, JobStore, StoreUnavailable
from neutral.host_origin import HostOriginRule
from tests.dashboard.site import Site, site
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TOKEN = "the-printed-token"
BASE = "http://127.0.0.1:8080"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Served:
    def __init__(self, made: Site, gateway: Gateway, store: JobStore) -> None:
        self.site, self.gateway, self.store = made, gateway, store

    def client(self, *, allow_actions: bool = False, prefix: str = "",
               store_down: bool = False) -> httpx2.AsyncClient:
        async def the_store() -> JobStore:
            if store_down:
                raise StoreUnavailable("the store is down for this test.")
            return self.store

        options = DashboardOptions(settings=self.site.settings, store=the_store,
                                   sessions=Sessions(TOKEN, one_time=True),
                                   allow_actions=allow_actions, prefix=prefix)
        app = build_dashboard_app(options, HostOriginRule.of("127.0.0.1"))
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE)

    async def submit(self, prompt: str, provider: str = "claude", **more: object) -> str:
        manager = await self.gateway.manager()
        done = await manager.submit(provider, SubmitRequest(prompt=prompt, force_refresh=True,
                                                            **more))  # type: ignore[arg-type]
        return done.job.id

    async def ended(self, job_id: str) -> None:
        manager = await self.gateway.manager()

        async def terminal() -> bool:
            return (await manager.reads.get(job_id)).status.is_terminal

        await wait_for(terminal, timeout=60)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    budgets = {"budgets": {"daily_usd": 5.0}}
    async with site(tmp_path, **budgets) as made:
        gateway = await made.start_gateway()
        store = await open_store(made.settings, role="dashboard")
        try:
            yield Served(made, gateway, store)
        finally:
            await store.close()


async def signed_in(client: httpx2.AsyncClient, prefix: str = "") -> None:
    answer = await client.get(f"{prefix}/?token={TOKEN}&status=completed")
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{prefix}/?status=completed"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.cookies.get(COOKIE_NAME)


async def test_every_page_renders_with_its_headers_and_job_data_escaped(served: Served) -> None:
    done = await served.submit("<b>bold</b> \x1b[1mloud\x1b[0m @tokens=10:5 @cost=0.5")
    failed = await served.submit("breaks @exit=3", provider="codex")
    for job in (done, failed):
        await served.ended(job)
    async with served.client() as client:
        assert (await client.get("/")).status_code == 401
        await signed_in(client)
        jobs = await client.get("/")
        assert jobs.status_code == 200
        assert "script-src 'self'" in jobs.headers["content-security-policy"]
        assert jobs.headers["server-timing"].startswith("app;dur=")
        assert "&lt;b&gt;bold&lt;/b&gt; loud" in jobs.text and "\x1b" not in jobs.text
        assert f'id="job-{failed}"' in jobs.text
        filtered = await client.get("/", params={"status": "failed", "provider": "codex",
                                                 "host": "nowhere"})
        assert "No jobs match." in filtered.text
        active = await client.get("/", params={"status": "active"})
        assert f'id="job-{done}"' not in active.text
        page = await client.get(f"/jobs/{done}")
        assert "fake-claude answer" in page.text and "cost_usd" in page.text
        assert "form" not in page.text.split("<main>")[1].split("<h2>")[0]  # read-only
        failing = await client.get(f"/jobs/{failed}")
        assert "provider_error" in failing.text
        assert (await client.get("/jobs/no-such-job")).status_code == 404
        usage = await client.get("/usage")
        assert "<svg" in usage.text and "$0.5000" in usage.text and "daily" in usage.text
        gateways = await client.get("/gateways")
        assert served.gateway.instance_id in gateways.text and "live" in gateways.text
        script = await client.get("/static/dashboard.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert (await client.get("/static/nothing.js")).status_code == 404


async def test_the_jobs_table_pages_by_its_last_row(served: Served) -> None:
    for n in range(PAGE_ROWS + 3):
        await served.store.insert_job(
            served_job(served, n), served.site.settings.lease.ttl_s)
    async with served.client() as client:
        await signed_in(client)
        first = await client.get("/")
        older = re.search(r'href="/\?(after=[^"]+)" rel="next"', first.text)
        assert older is not None and first.text.count('<tr id="job-') == PAGE_ROWS
        second = await client.get(f"/?{older.group(1).replace('&amp;', '&')}")
        assert second.text.count('<tr id="job-') == 3 and "First page" in second.text


def served_job(served: Served, n: int) -> NewJob:
    return NewJob(id=f"job-{n:04d}-{served.gateway.instance_id[:8]}", provider="claude",
                  request_key=f"key-{n}", owner_instance="elsewhere", hostname="other-host",
                  request_json=json.dumps({"prompt": f"paged {n}"}), forced=True)


async def test_actions_need_the_flag_and_the_sessions_csrf_token(served: Served) -> None:
    job = await served.submit("wait here @sleep=300")
    async with served.client() as read_only:
        await signed_in(read_only)
        assert (await read_only.post(f"/jobs/{job}/cancel", data={"csrf": "x"})).status_code == 403
    async with served.client(allow_actions=True) as client:
        await signed_in(client)
        page = await client.get(f"/jobs/{job}")
        csrf = CSRF.search(page.text)
        assert csrf is not None and 'data-confirm="Cancel this job?"' in page.text
        forged = await client.post(f"/jobs/{job}/cancel", data={"csrf": "forged"})
        assert forged.status_code == 403
        unknown = await client.post(f"/jobs/{job}/explode", data={"csrf": csrf.group(1)})
        assert unknown.status_code == 404
        missing = await client.post("/jobs/no-such-job/cancel", data={"csrf": csrf.group(1)})
        assert missing.status_code == 404
        not_isolated = await client.post(f"/jobs/{job}/apply", data={"csrf": csrf.group(1)})
        assert not_isolated.status_code == 409 and "did not run isolated" in not_isolated.text
        cancelled = await client.post(f"/jobs/{job}/cancel", data={"csrf": csrf.group(1)})
        assert cancelled.status_code == 303
        assert cancelled.headers["location"] == f"/jobs/{job}?done=cancel"
    await served.ended(job)
    row = await served.store.get_job(job, with_output=False)
    assert row is not None and row.status is JobStatus.CANCELLED


async def test_under_a_prefix_links_and_cookie_carry_it_and_a_store_down_is_503(
        served: Served) -> None:
    async with served.client(prefix="/ui") as client:
        await signed_in(client, "/ui")
        page = await client.get("/ui/")
        assert 'href="/ui/usage"' in page.text and 'src="/ui/static/dashboard.js"' in page.text
    async with served.client(store_down=True) as down:
        await signed_in(down)
        answer = await down.get("/")
        assert answer.status_code == 503 and "the store is down for this test." in answer.text


async def test_a_foreign_host_or_origin_is_refused(served: Served) -> None:
    async with served.client() as client:
        assert (await client.get("/", headers={"Host": "evil.example:8080"})).status_code == 421
        assert (await client.get("/", headers={"Origin": "http://evil.example"})).status_code == 403


async def test_the_jobs_stream_sends_the_rows_when_a_row_changes(served: Served) -> None:
    first = await served.submit("one")
    await served.ended(first)
    sent: list[str] = []

    async def disconnected() -> bool:
        return len(sent) >= 3

    stream = live.jobs_stream(served.store, JobsPage(), lambda rows, _now: ",".join(
        f"{r.id}:{r.status.value}" for r in rows), disconnected)
    async for chunk in stream:
        sent.append(chunk)
        if len(sent) == 2:
            second = await served.submit("two")
            await served.ended(second)
    assert sent[0].startswith("retry:")
    assert f"{first}:completed" in sent[1] and "event: rows" in sent[1]
    assert f"{second}:" in sent[2]


async def test_the_job_stream_follows_a_run_to_its_end(served: Served) -> None:
    job = await served.submit("count @stream=20:0.05", provider="devin")
    events: list[str] = []

    async def disconnected() -> bool:
        return False

    stream = live.job_stream(served.site.settings, served.store, job,
                             lambda row, _now: row.status.value, disconnected)
    async for chunk in stream:
        events.append(chunk)
    names = [line.split(": ", 1)[1] for chunk in events for line in chunk.splitlines()
             if line.startswith("event: ")]
    assert names[0] == "status" and names[-1] == "end" and "tail" in names
    text = "".join(json.loads(line[len("data: "):]) for chunk in events
                   if chunk.startswith("event: tail") for line in chunk.splitlines()[1:]
                   if line.startswith("data: "))
    assert "progress 20/20" in text
    gone = [chunk async for chunk in live.job_stream(
        served.site.settings, served.store, "no-such-job", lambda row, _now: "", disconnected)]
    assert gone[-1].startswith("event: end")


async def test_the_dashboard_listener_prints_a_one_time_address_and_serves_it(
        served: Served) -> None:
    printed: list[str] = []
    run = DashboardRun(host="127.0.0.1", port=0)
    async with anyio.create_task_group() as group:
        group.start_soon(serve_dashboard, served.site.settings, run, printed.append)
        await wait_for(lambda: printed, timeout=30)
        address = printed[0]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{43}", address)
        async with httpx2.AsyncClient() as client:
            await wait_for(lambda: probe(client, address.split("?")[0]), timeout=30)
            assert (await client.get(address)).status_code == 303
            assert (await client.get(address.split("?")[0])).status_code == 200
            assert (await client.get(address)).status_code == 303  # the session keeps it
        group.cancel_scope.cancel()
    with pytest.raises(ValueError, match="fixed token"):
        await serve_dashboard(served.site.settings, DashboardRun(host="0.0.0.0", port=0),
                              printed.append)


async def probe(client: httpx2.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url)).status_code == 401
    except httpx2.HTTPError:
        return False
