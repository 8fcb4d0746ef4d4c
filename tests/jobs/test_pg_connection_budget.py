"""PostgreSQL at the scale of many windows (issue #29): a server with few connection slots
serves forty stdio gateways, each admitted job runs (none fails for want of a connection),
and idle gateways give their connections back.

A throwaway server of the test's own with `max_connections = 25` (22 slots for a role that
is not a superuser: the gateways connect as one, as a real deployment would). Forty gateway
runtimes are built exactly as the stdio server builds them, in one process, with the
default lease intervals; their jobs run the fake CLIs through real supervisors. The windows
open over one heartbeat interval, as people open them, not all in the same millisecond (in
step, their renewals would come in bursts of forty forever).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from gateway.config import load_settings
from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, GatewayError, JobStatus
from gateway.runtime import Gateway
from gateway.store.postgres.pool import APPLICATION_NAME, FULL_SERVER_S, IDLE_RELEASE_S
from tests.conftest import PostgresServer
from tests.jobs.conftest import FAKE_COMMANDS, FAKES_BIN, FakeLog
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

GATEWAYS = 40
MAX_CONNECTIONS = 25  # minus superuser_reserved_connections (3): 22 for the gateways' role
IDLE_CONNECTIONS_MAX = 10  # what forty idle windows may hold between them
ROLE = "gateway"
RUN_BOUND_S = 240.0  # every gateway ready and every job run, on a loaded 2-core box
SAMPLES = 20  # connection counts taken over the idle phase, one a second
HEARTBEAT_S = 15.0  # lease.heartbeat_s default


@pytest.fixture
def small_server(make_postgres_server: Callable[[dict[str, str]], PostgresServer]
                 ) -> PostgresServer:
    server = make_postgres_server({"max_connections": str(MAX_CONNECTIONS)})
    server.admin([f"CREATE ROLE {ROLE} LOGIN", f"CREATE DATABASE jobs OWNER {ROLE}"])
    return server


async def gateway_connections(server: PostgresServer) -> int:
    """Server connections of the gateways, counted from a superuser's reserved slot."""
    conn = await asyncpg.connect(server.admin_dsn)
    try:
        return int(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND application_name = $2",
            ROLE, APPLICATION_NAME))
    finally:
        await conn.close()


async def submit_until_admitted(gateway: Gateway, prompt: str) -> str:
    """What a client does with `unavailable`: retry. Any other error fails the test."""
    while True:
        try:
            manager = await gateway.manager()
            submission = await manager.submit("claude", SubmitRequest(prompt=prompt))
            return submission.job.id
        except GatewayError as err:
            assert err.kind == ErrorKind.UNAVAILABLE, err.message
            await anyio.sleep(0.5)


async def wait_until_terminal(gateway: Gateway, job_id: str) -> Any:
    """llm_job_wait as a client uses it: a read the full server could not serve in time
    answers `unavailable`, and the client asks again."""
    while True:
        try:
            row = await (await gateway.manager()).reads.wait(job_id, RUN_BOUND_S)
        except GatewayError as err:
            assert err.kind == ErrorKind.UNAVAILABLE, err.message
            await anyio.sleep(0.5)
            continue
        if not row.status.is_active:
            return row


async def test_forty_windows_on_a_server_with_22_slots_all_run_and_idle_on_few_connections(
    small_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    fake_log = FakeLog(tmp_path / "fake-cli.log")
    providers: dict[str, Any] = {
        name: {"command": str(FAKES_BIN / binary), "env": {"FAKE_CLI_LOG": str(fake_log.path)}}
        for name, binary in FAKE_COMMANDS.items()}
    settings = load_settings(
        persistence={"backend": "postgres", "dsn": small_server.dsn_for("jobs", user=ROLE)},
        providers=providers)
    assert settings.persistence.pool_max_for("stdio") == 2
    gateways = [Gateway(settings, role="stdio") for _ in range(GATEWAYS)]
    rows: dict[int, Any] = {}
    try:
        with anyio.fail_after(scaled(RUN_BOUND_S)):
            async def run_one(index: int) -> None:
                gateway = gateways[index]
                await anyio.sleep(index * HEARTBEAT_S / GATEWAYS)
                gateway.start_in_background()
                job_id = await submit_until_admitted(gateway, f"window {index}")
                rows[index] = await wait_until_terminal(gateway, job_id)

            async with anyio.create_task_group() as tg:
                for index in range(GATEWAYS):
                    tg.start_soon(run_one, index)
        assert all(gateway.ready for gateway in gateways)
        failed = {i: (row.status, row.error) for i, row in rows.items()
                  if row.status != JobStatus.COMPLETED}
        assert failed == {}
        assert len(fake_log.spawns()) == GATEWAYS  # each job ran once
        refused = sum(gateway.connection_report()["pool"]["work"]["refused_connects"]  # type: ignore[index]
                      for gateway in gateways)
        # Idle: the work pools close what they hold after IDLE_RELEASE_S; the heartbeat's
        # connection lives about a second per heartbeat_s (15 s).
        await anyio.sleep(IDLE_RELEASE_S + FULL_SERVER_S)
        counts = []
        for _ in range(SAMPLES):
            counts.append(await gateway_connections(small_server))
            await anyio.sleep(1.0)
        # Judged on the median sample: connections held by idle windows, what this guards
        # against, show in every sample. Forty gateways share this one event loop, and on a
        # loaded box a stall of it lets their periodic reads (renewals, notice and attempt
        # sweeps, the reaper) bunch up behind it and hold connections together for a
        # moment: seen 18 in one sample of twenty with the rest 0-3, and in CI [2, 12, 5,
        # 5, 18, 3, ...] after 439 refused connects in the run phase.
        assert sorted(counts)[SAMPLES // 2] <= IDLE_CONNECTIONS_MAX, (counts, refused)
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(scaled(60)):
            async with anyio.create_task_group() as tg:
                for gateway in gateways:
                    tg.start_soon(gateway.stop)


# -- renewals never wait behind work (issue #22) ------------------------------------------

BLOCKED_LEASE = {"heartbeat_s": 0.5, "ttl_s": 2.0, "http_job_grace_s": 2.0,
                 "sweep_interval_s": 0.2, "instance_gc_s": 2.0, "cancel_poll_s": 0.2}


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_pool_blocked_on_row_locks_for_twice_the_ttl_costs_a_live_gateway_nothing(
    make_settings: Callable[..., Any], start_gateway: Callable[..., Any], postgres_dsn: str,
) -> None:
    """An outside session holds FOR UPDATE on the owner's job row for 2 x ttl_s, and every
    connection of the owner's work pool waits on that lock. Its heartbeat has a slot of its
    own, so its lease stays fresh; a peer sweeping all along orphans nothing; the renewal
    waits are measured and reported."""
    settings = make_settings(lease=BLOCKED_LEASE)
    owner = await start_gateway(settings)
    peer = await start_gateway(settings)
    hold_s = 2 * settings.lease.ttl_s
    manager = await owner.manager()
    job = (await manager.submit("claude", SubmitRequest(prompt="long @sleep=8"))).job
    outside = await asyncpg.connect(postgres_dsn)
    try:
        async with anyio.create_task_group() as tg:
            transaction = outside.transaction()
            await transaction.start()
            await outside.execute("SELECT id FROM jobs WHERE id = $1 FOR UPDATE", job.id)
            renewed_before = await outside.fetchval(
                "SELECT heartbeat_at FROM gateway_instances WHERE instance_id = $1",
                owner.instance_id)

            async def blocked_call() -> None:  # takes one work connection until the lock goes
                async with owner.store._connection("blocked") as conn:
                    await conn.execute("SELECT id FROM jobs WHERE id = $1 FOR UPDATE", job.id)

            for _ in range(settings.persistence.pool_max_for("stdio")):
                tg.start_soon(blocked_call)
            with anyio.fail_after(scaled(hold_s + 10)):
                deadline = anyio.current_time() + hold_s
                while anyio.current_time() < deadline:
                    assert await peer.leases.sweep_once() == []
                    await anyio.sleep(settings.lease.sweep_interval_s)
            pool = owner.connection_report()["pool"]["work"]
            assert pool["size"] == pool["max"] and pool["idle"] == 0  # every one is blocked
            renewed_during = await outside.fetchval(
                "SELECT heartbeat_at FROM gateway_instances WHERE instance_id = $1",
                owner.instance_id)
            await transaction.rollback()
        assert renewed_during > renewed_before  # the lease was renewed while blocked
        for _ in range(5):  # and once the lock is gone, still nothing is orphaned
            assert await peer.leases.sweep_once() == []
            await anyio.sleep(settings.lease.sweep_interval_s)
        worst = owner.connection_report()["renewal_pending_ms_max_1h"]
        assert worst is not None and worst < settings.lease.ttl_s * 1000
        row = await manager.reads.wait(job.id, 30)
        assert row.status == JobStatus.COMPLETED, (row.status, row.error)
    finally:
        await outside.close()
