"""Old and new gateways on one store (the upgrade tests' harness).

The previous release (tests/upgrade/PREVIOUS_RELEASE, installed into a venv of its own by
conftest.py) and this checkout each run as `python -m gateway` behind the MCP SDK's stdio
client, with the fake claude CLI, sharing one SQLite file or one PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import tomli_w
from mcp import Client, StdioServerParameters

from gateway.config import load_settings
from gateway.store import open_store
from tests.waiting import scaled

REPO = Path(__file__).resolve().parents[2]
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

    async def window(self, close: anyio.Event, *, old: bool, closed: anyio.Event | None = None,
                     task_status: anyio.abc.TaskStatus[Client] = anyio.TASK_STATUS_IGNORED,
                     ) -> None:
        """A client window in a task of its own, open until `close` is set: old and new
        windows then close in any order (a client's cancel scopes belong to its task).
        `closed` is set once its gateway process has ended."""
        async with self.gateway(old=old) as client:
            task_status.started(client)
            await close.wait()
        if closed is not None:
            closed.set()

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
        with anyio.fail_after(scaled(SETTLE_S)):
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
        with anyio.fail_after(scaled(SETTLE_S)):
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
