"""Two "hosts" on one machine (issue 42): a laptop gateway without codex and a worker with
it, each in its own UTS namespace with its own HOME, PATH and provider set, on one
PostgreSQL. The laptop submits with runs_on, the worker runs it, the answer reads back; a
selector nobody meets says why and ends no_worker; a cancel from the laptop stops the
worker's process group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from mcp import Client

from gateway import proc
from gateway.jobs.placement import live_hosts
from gateway.model import JobStatus
from gateway.store.base import JobStore
from tests.conftest import PostgresServer
from tests.waiting import wait_for
from tests.workers.hosts import Host, need_namespaces, observer, structured

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0  # a cold `python -m gateway worker` on a loaded 2-core box


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def hosts(tmp_path: Path, postgres_dsn: str) -> Iterator[dict[str, Host]]:
    need_namespaces()
    made = {
        "laptop": Host(tmp_path, "laptop", postgres_dsn, ("claude",),
                       worker={"queue_timeout_s": 4.0}),
        "buildbox": Host(tmp_path, "buildbox", postgres_dsn, ("codex", "claude")),
    }
    try:
        yield made
    finally:
        for host in made.values():
            host.stop()


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    data = structured(result)
    assert not result.is_error, data
    return data


async def worker_ready(store: JobStore, hostname: str) -> bool:
    hosts = live_hosts(await store.list_instances(), await store.now())
    return any(h.hostname == hostname and "codex" in h.providers for h in hosts)


async def start_buildbox(host: Host, store: JobStore, *args: str) -> None:
    host.start_worker("--label", "arch=x86", *args)
    try:
        await wait_for(lambda: worker_ready(store, host.name), timeout=READY_TIMEOUT_S,
                       step=0.1)
    except TimeoutError:
        raise AssertionError(f"worker never published codex: {host.stderr()}") from None


async def test_the_laptop_without_codex_runs_codex_on_the_worker(
        hosts: dict[str, Host], postgres_dsn: str, tmp_path: Path) -> None:
    laptop, buildbox = hosts["laptop"], hosts["buildbox"]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            await start_buildbox(buildbox, store)
            async with laptop.client() as client:
                status = await call(client, "gateway_status")
                # The laptop may be listed too ([worker] accept_remote: it claims what it
                # can run), once its first capabilities are published: the buildbox is.
                workers = {w["hostname"]: w for w in status["workers"]}
                assert set(workers) <= {"laptop", "buildbox"}, workers
                caps = workers["buildbox"]["capabilities"]
                assert caps["providers"]["codex"]["logged_in"] == "yes"
                assert caps["labels"] == {"arch": "x86"} and caps["accept_remote"] is True
                tools = {t.name: t for t in (await client.list_tools()).tools}
                # Only the worker has codex: its tools are listed, runs_on defaults to any.
                schema = tools["codex_request_async"].input_schema["properties"]["runs_on"]
                assert schema["default"] == "any"
                assert "default" not in tools["claude_request"].input_schema[
                    "properties"]["runs_on"]
                started = await call(client, "codex_request_async",
                                     prompt="hello from the laptop", runs_on="any")
                job_id = started["job_id"]
                done = await call(client, "llm_job_wait", job_id=job_id, timeout_s=45)
                assert done["status"] == "completed", done
                result = await call(client, "llm_job_result", job_id=job_id)
            row = await store.get_job(job_id)
    assert "fake-codex answer: hello from the laptop" in json.dumps(result)
    assert row is not None and row.hostname == "buildbox" and row.claimed_at is not None
    assert [s["prompt"] for s in buildbox.spawns()] == ["hello from the laptop"]
    assert laptop.spawns() == []
    assert row.hostname != proc.hostname()


async def test_a_selector_nobody_meets_says_why_then_ends_no_worker(
        hosts: dict[str, Host], postgres_dsn: str, tmp_path: Path) -> None:
    laptop, buildbox = hosts["laptop"], hosts["buildbox"]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            await start_buildbox(buildbox, store)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                started = await call(client, "codex_request_async", prompt="needs a gpu",
                                     runs_on={"labels": {"gpu": "true"}})
                job_id = started["job_id"]

                async def reason() -> str | None:
                    data = await call(client, "llm_job_status", job_id=job_id)
                    return data.get("unschedulable_reason")

                why = await wait_for(reason, timeout=30, step=0.2)
                assert "codex" in why and "gpu" in why, why
                final = await call(client, "llm_job_wait", job_id=job_id, timeout_s=45)
            row = await store.get_job(job_id)
    assert final["status"] == "failed" and final["error_kind"] == "no_worker", final
    assert row is not None and row.status is JobStatus.FAILED and row.claimed_at is None
    assert buildbox.spawns() == []


async def test_a_cancel_from_the_laptop_stops_the_workers_process_group(
        hosts: dict[str, Host], postgres_dsn: str, tmp_path: Path) -> None:
    laptop, buildbox = hosts["laptop"], hosts["buildbox"]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store:
            await start_buildbox(buildbox, store)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                started = await call(client, "codex_request_async",
                                     prompt="long work @sleep=300 @grandchild=300",
                                     runs_on={"host": "buildbox"})
                job_id = started["job_id"]
                [spawn] = await wait_for(buildbox.spawns, timeout=45, step=0.1)
                await wait_for(lambda: store_status(store, job_id, JobStatus.RUNNING),
                               timeout=30)
                answer = await call(client, "llm_job_cancel", job_id=job_id)
                assert answer["outcome"] in ("cancel_requested", "cancelled"), answer
                final = await call(client, "llm_job_wait", job_id=job_id, timeout_s=45)
    assert final["status"] == "cancelled", final
    pgid = spawn["pgid"]
    await wait_for(lambda: not group_alive(pgid), timeout=15)


async def store_status(store: JobStore, job_id: str, status: JobStatus) -> bool:
    row = await store.get_job(job_id, with_output=False)
    return row is not None and row.status is status


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def test_a_serving_gateway_that_accepts_remote_work_claims_too(
        tmp_path: Path, postgres_dsn: str) -> None:
    """DESIGN §9: "any live gateway or worker that can run it": a `serve` gateway with
    [worker] accept_remote on the shared store claims like a worker."""
    need_namespaces()
    laptop = Host(tmp_path, "laptop", postgres_dsn, ("claude",),
                  worker={"accept_remote": False})
    desktop = Host(tmp_path, "desktop", postgres_dsn, ("codex",))
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with observer(postgres_dsn, tmp_path) as store, desktop.client() as served:
            await call(served, "gateway_status")

            async def desktop_ready() -> bool:
                hosts = live_hosts(await store.list_instances(), await store.now())
                return any(h.hostname == "desktop" and "codex" in h.providers
                           for h in hosts)

            await wait_for(desktop_ready, timeout=READY_TIMEOUT_S, step=0.1)
            async with laptop.client() as client:
                await call(client, "gateway_status")
                started = await call(client, "codex_request_async", prompt="on the desktop",
                                     runs_on={"host": "desktop"})
                done = await call(client, "llm_job_wait", job_id=started["job_id"],
                                  timeout_s=45)
            row = await store.get_job(started["job_id"])
    assert done["status"] == "completed", (done, desktop.stderr())
    assert row is not None and row.hostname == "desktop" and row.claimed_at is not None
    assert [s["prompt"] for s in desktop.spawns()] == ["on the desktop"]


async def test_a_worker_that_loses_postgresql_for_a_while_takes_work_again_once_it_is_back(
        make_postgres_server: Callable[[dict[str, str]], PostgresServer],
        tmp_path: Path) -> None:
    """PostgreSQL crashes (an immediate stop) under a live worker with a run under way, and
    comes back: the run went on and ended during the outage, and its end is written once
    the store is back; the same worker process, never restarted, publishes its capabilities
    again (its row collected meanwhile) and runs the next job the laptop submits."""
    need_namespaces()
    server = make_postgres_server({})
    server.create_database("fleet")
    dsn = server.dsn_for("fleet")
    laptop = Host(tmp_path, "laptop", dsn, ("claude",))
    buildbox = Host(tmp_path, "buildbox", dsn, ("codex", "claude"))
    try:
        with anyio.fail_after(TEST_TIMEOUT_S):
            gate = tmp_path / "gate"
            async with observer(dsn, tmp_path) as store:
                await start_buildbox(buildbox, store)
                async with laptop.client() as client:
                    await call(client, "gateway_status")
                    during = await call(client, "codex_request_async",
                                        prompt=f"through the outage @until={gate}",
                                        runs_on="any")
                await wait_for(buildbox.spawns, timeout=60, step=0.05)
            worker_pid = buildbox.process.pid if buildbox.process else None
            server.stop()  # like a crash: every connection drops
            await wait_for(lambda: "heartbeat failed" in buildbox.stderr(), timeout=60,
                           step=0.1)
            gate.touch()  # the run ends while the store is down
            await wait_for(lambda: any(buildbox.home.rglob("end.json")), timeout=60, step=0.1)
            server.start()
            async with observer(dsn, tmp_path) as store:
                await wait_for(lambda: worker_ready(store, "buildbox"), timeout=READY_TIMEOUT_S,
                               step=0.1)
                # Its row collected, as instances GC does to a lease lapsed in an outage:
                # the worker registers again, with its capabilities.
                conn = await asyncpg.connect(dsn)
                try:
                    await conn.execute("DELETE FROM gateway_instances WHERE hostname = $1",
                                       "buildbox")
                finally:
                    await conn.close()
                await wait_for(lambda: worker_ready(store, "buildbox"), timeout=READY_TIMEOUT_S,
                               step=0.1)
                async with laptop.client() as client:
                    await call(client, "gateway_status")
                    started = await call(client, "codex_request_async",
                                         prompt="after the outage", runs_on="any")
                    done = await call(client, "llm_job_wait", job_id=started["job_id"],
                                      timeout_s=45)
                    through = await call(client, "llm_job_wait", job_id=during["job_id"],
                                         timeout_s=45)
                    answer = await call(client, "llm_job_result", job_id=during["job_id"])
            assert done["status"] == "completed", (done, buildbox.stderr()[-3000:])
            assert through["status"] == "completed", (through, buildbox.stderr()[-3000:])
            assert "through the outage" in json.dumps(answer)
        assert buildbox.process is not None and buildbox.process.poll() is None
        assert buildbox.process.pid == worker_pid  # the same worker, never restarted
        assert [s["prompt"] for s in buildbox.spawns()] == [
            f"through the outage @until={gate}", "after the outage"]
    finally:
        for host in (laptop, buildbox):
            host.stop()
