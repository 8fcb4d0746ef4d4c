"""The upgrade test (issue #22): the previous release and this one serve one store together.

Real processes only: the previous release (tests/upgrade/PREVIOUS_RELEASE, installed into a
venv of its own by conftest.py) and this checkout each run as `python -m gateway` behind
the MCP SDK's stdio client, with the fake claude CLI, sharing one SQLite file or one
PostgreSQL database. In order:

1. the old gateway creates the store and starts job A; the new one starts meanwhile and
   migrates the store under it (both serving); A completes under the old one and the new
   one never orphans it;
2. the old gateway starts B (running) and C (queued behind it: one run at a time), and its
   window closes (detach): the new one adopts B and finalizes it with its real answer, and
   runs C once;
3. the old gateway is started again on the migrated store: it refuses with a clear error
   (0.1.0 reads no lowest-writer record: any newer schema is refused) and writes nothing.

Every job runs exactly once (the fake CLI's spawn log), none is ever seen `orphaned` or
lost, and each ends `completed` with its own answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import tomli_w
from mcp import Client, StdioServerParameters

from gateway.config import load_settings
from gateway.model import JobStatus
from gateway.store import open_store
from gateway.store.base import SCHEMA_VERSION
from tests.upgrade.conftest import REPO

pytestmark = pytest.mark.anyio

FAKES_BIN = REPO / "tests" / "fakes" / "bin"
CLIENT_TIMEOUT_S = 60.0
SETTLE_S = 60.0  # a job's whole life here is seconds; a loaded 2-core box gets slack
POLL_S = 0.1
# Fast leases, in keys both releases accept: adoption and the reaper act within a second
# or two, so a mistake (a false orphan, a lost job) shows within the test.
LEASE = {"heartbeat_s": 0.2, "ttl_s": 2.0, "http_job_grace_s": 2.0, "sweep_interval_s": 0.2,
         "instance_gc_s": 2.0, "cancel_poll_s": 0.2, "drain_timeout_s": 1.5}


class Fleet:
    """Old and new gateways on one store, and what they share."""

    def __init__(self, root: Path, persistence: dict[str, Any], previous_python: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.fake_log = root / "fake-cli.log"
        self.previous_python = previous_python
        self.config = root / "config.toml"
        self.config.write_bytes(tomli_w.dumps({
            "persistence": persistence, "lease": LEASE,
            "limits": {"max_running_jobs": 1, "kill_grace_s": 1.0},
            "logging": {"level": "info", "format": "json"},
            "providers": {"claude": {"env": {"FAKE_CLI_LOG": str(self.fake_log)}}},
        }).encode())
        self.seen: dict[str, set[str]] = {}  # every status each job was ever read with

    def _params(self, old: bool) -> StdioServerParameters:
        path = os.pathsep.join([str(FAKES_BIN), str(Path(sys.executable).parent),
                                os.environ.get("PATH", os.defpath)])
        env = {"HOME": str(self.home), "PATH": path, "AGENT_GATEWAY_CONFIG": str(self.config),
               "PYTHONUNBUFFERED": "1"}
        if old:  # isolated: nothing of this checkout can shadow the installed release
            return StdioServerParameters(command=str(self.previous_python),
                                         args=["-I", "-m", "gateway"], env=env,
                                         cwd=str(self.home))
        return StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                     env={**env, "PYTHONPATH": str(REPO)}, cwd=str(self.home))

    @contextlib.asynccontextmanager
    async def gateway(self, *, old: bool) -> AsyncIterator[Client]:
        async with Client(self._params(old), read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            yield client

    async def window(self, close: anyio.Event, *, old: bool,
                     task_status: anyio.abc.TaskStatus[Client] = anyio.TASK_STATUS_IGNORED,
                     ) -> None:
        """A client window in a task of its own, open until `close` is set: old and new
        windows then close in any order (a client's cancel scopes belong to its task)."""
        async with self.gateway(old=old) as client:
            task_status.started(client)
            await close.wait()

    async def submit(self, client: Client, prompt: str) -> str:
        result = await client.call_tool("claude_request_async", {"prompt": prompt})
        assert not result.is_error, result
        assert result.structured_content is not None
        return str(result.structured_content["job_id"])

    async def status(self, client: Client, job_id: str) -> str:
        result = await client.call_tool("llm_job_status", {"job_id": job_id})
        assert not result.is_error, result
        assert result.structured_content is not None
        status = str(result.structured_content["status"])
        self.seen.setdefault(job_id, set()).add(status)
        return status

    async def until(self, client: Client, job_id: str, *statuses: str) -> str:
        with anyio.fail_after(SETTLE_S):
            while (status := await self.status(client, job_id)) not in statuses:
                assert status not in ("orphaned", "failed"), (job_id, status, self.seen)
                await anyio.sleep(POLL_S)
        return status

    def prompts(self) -> list[str]:
        if not self.fake_log.exists():
            return []
        lines = self.fake_log.read_text().splitlines()
        return [str(json.loads(line)["prompt"]) for line in lines
                if line.strip() and "prompt" in json.loads(line)]

    async def until_started(self, prompt: str) -> None:
        with anyio.fail_after(SETTLE_S):
            while prompt not in self.prompts():
                await anyio.sleep(POLL_S)

    async def rows(self) -> dict[str, tuple[str, int, str | None, str]]:
        """Every job as the store holds it: status, re-queues, orphaned_by, answer."""
        store = await open_store(load_settings(self.config))
        try:
            found = {}
            for row in await store.list_jobs(limit=100):
                found[row.id] = (row.status.value, row.requeue_count, row.orphaned_by,
                                 f"{row.output or ''}{row.result_json or ''}")
            return found
        finally:
            await store.close()

    async def schema_version(self) -> int:
        store = await open_store(load_settings(self.config))
        try:
            return await store.schema_version()
        finally:
            await store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path, previous_python: Path) -> Fleet:
    if request.param == "sqlite":
        persistence: dict[str, Any] = {"backend": "sqlite",
                                       "path": str(tmp_path / "state" / "jobs.db")}
    else:
        persistence = {"backend": "postgres", "dsn": request.getfixturevalue("postgres_dsn")}
    return Fleet(tmp_path, persistence, previous_python)


async def test_the_previous_release_and_this_one_share_a_store_through_an_upgrade(
    fleet: Fleet,
) -> None:
    prompts = {"a": "@sleep=15 served-by-old-while-new-migrates",
               "b": "@sleep=4 detached-by-old-adopted-by-new",
               "c": "queued-on-old-run-on-new"}
    close_old = anyio.Event()
    async with anyio.create_task_group() as windows:
        old: Client = await windows.start(partial(fleet.window, close_old, old=True))
        a = await fleet.submit(old, prompts["a"])
        await fleet.until_started(prompts["a"])
        async with fleet.gateway(old=False) as new:
            # The new gateway migrated the store under the old one, which keeps serving.
            assert await fleet.status(new, a) == "running"
            assert await fleet.schema_version() == SCHEMA_VERSION
            assert await fleet.until(old, a, "completed") == "completed"
            assert await fleet.status(new, a) == "completed"

            b = await fleet.submit(old, prompts["b"])
            await fleet.until_started(prompts["b"])
            c = await fleet.submit(old, prompts["c"])
            assert await fleet.status(old, c) == "queued"  # one run at a time
            close_old.set()  # the old window closes: B detached, C left queued

            assert await fleet.until(new, b, "completed") == "completed"
            assert await fleet.until(new, c, "completed") == "completed"

    rows = await fleet.rows()
    for name, job_id in (("a", a), ("b", b), ("c", c)):
        status, _requeues, orphaned_by, answer = rows[job_id]
        assert status == JobStatus.COMPLETED.value and orphaned_by is None, (name, rows[job_id])
        assert f"fake-claude answer: {prompts[name]}" in answer, (name, answer)
    assert rows[c][1] <= 1  # queued again once, when its owner was proven gone
    assert sorted(fleet.prompts()) == sorted(prompts.values())  # each ran exactly once
    assert all("orphaned" not in seen for seen in fleet.seen.values()), fleet.seen

    # The old release started again on the migrated store: refused clearly, nothing written.
    async with fleet.gateway(old=True) as old_again:
        with anyio.fail_after(SETTLE_S):
            while True:  # "still starting" (unavailable) until its first open has failed
                refused = await old_again.call_tool("llm_job_list", {})
                assert refused.is_error and refused.structured_content is not None
                if refused.structured_content["error_kind"] != "unavailable":
                    break
                await anyio.sleep(POLL_S)
    assert refused.structured_content["error_kind"] == "setup_error"
    assert refused.structured_content["retryable"] is False
    text = " ".join(getattr(part, "text", "") for part in refused.content)
    assert "newer than this gateway understands" in text and "upgrade agent-cli-gateway" in text
    assert await fleet.rows() == rows
    assert await fleet.schema_version() == SCHEMA_VERSION
    assert sorted(fleet.prompts()) == sorted(prompts.values())
