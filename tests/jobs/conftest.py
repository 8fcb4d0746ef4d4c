"""Fixtures for the job manager and lease tests: a real store (SQLite file or PostgreSQL
database), the fake provider CLIs, and gateways built exactly as the server builds them."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol, TypedDict

import anyio
import pytest

from gateway import proc
from gateway.config import Settings, load_settings
from gateway.jobs.leases import LeaseKeeper
from gateway.jobs.run import spool
from gateway.model import InstanceRow, JobRow, NewJob
from gateway.runtime import Gateway
from gateway.store import open_store
from gateway.store.base import JobStore
from tests.waiting import scaled

FAKES_BIN = Path(__file__).resolve().parents[1] / "fakes" / "bin"
FAKE_COMMANDS = {
    "claude": "claude", "codex": "codex", "gemini": "agy", "grok": "grok",
    "mistral": "vibe", "devin": "devin", "cursor": "cursor-agent",
}

STOP_BOUND_S = 30.0  # a gateway's stop at a test's end, on a loaded box

# Short lease knobs so lease behaviour is observable in a fast test.
FAST_LEASE = {"heartbeat_s": 0.2, "ttl_s": 1.0, "http_job_grace_s": 1.0,
              "sweep_interval_s": 0.2, "instance_gc_s": 1.0, "cancel_poll_s": 0.2,
              "drain_timeout_s": 1.5}


MakeSettings = Callable[..., Settings]
"""The `make_settings` fixture: section overrides (keyword per config section) -> Settings."""


class StartGateway(Protocol):
    """The `start_gateway` fixture: start a gateway as the server does (stopped at teardown)."""

    async def __call__(self, settings: Settings, role: str = "stdio") -> Gateway: ...


class HostIdentity(TypedDict):
    """The host columns of a job or instance row (NewJob, InstanceRow keyword arguments)."""

    hostname: str
    boot_id: str


def here() -> HostIdentity:
    """This host's identity, for rows the test writes as if a process here had."""
    return {"hostname": proc.hostname(), "boot_id": proc.boot_id()}


def claude_request_json(prompt: str) -> str:
    """A stored claude request, as admission writes it into `request_json`."""
    return json.dumps({"provider": "claude", "prompt": prompt, "model": None,
                       "working_dir": None, "session_id": None, "options": {}})


async def left_running(settings: Settings, job: NewJob, owner: InstanceRow | None = None) -> Path:
    """`job` as an owner that died between its row saying running and its supervisor's claim
    left it: inserted, marked running, its attempt dir made (no claim in it). `owner`: the
    owner's instance row, if it was not collected. Returns the attempt dir."""
    store = await open_store(settings)
    try:
        if owner is not None:
            await store.register_instance(owner, 0.05)
        await store.insert_job(job, 0.05)
        assert await store.mark_running(job.id, job.owner_instance, 0.05)
        row = await store.get_job(job.id)
        assert row is not None
        attempt = spool.run_dir(spool.spool_root(settings.state_dir), row)
        spool.make_run_dir(attempt)
        return attempt
    finally:
        await store.close()


def leases_of(gateway: Gateway) -> LeaseKeeper:
    """A started gateway's lease keeper (it is None only before `start()`)."""
    assert gateway.leases is not None, "the gateway is not started"
    return gateway.leases


def store_of(gateway: Gateway) -> JobStore:
    """A started gateway's store (it is None only before `start()`)."""
    assert gateway.store is not None, "the gateway is not started"
    return gateway.store


async def job_row(store: JobStore, job_id: str) -> JobRow:
    """The job's row, which the test knows is there (an absent row fails the test here)."""
    row = await store.get_job(job_id)
    assert row is not None, f"job {job_id} is not in the store"
    return row


class FakeLog:
    """The fake CLIs' invocation log (FAKE_CLI_LOG): one JSON line per spawn."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def spawns(self) -> list[dict[str, Any]]:
        return [e for e in self.entries() if "argv" in e]

    def prompts(self) -> list[str]:
        return [e.get("prompt", "") for e in self.spawns()]


@pytest.fixture
def fake_log(tmp_path: Path) -> FakeLog:
    return FakeLog(tmp_path / "fake-cli.log")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_settings(
    backend: str, tmp_path: Path, fake_log: FakeLog, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> MakeSettings:
    """Settings for a gateway on the test's store, with every provider pointing at its fake."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    persistence: dict[str, Any] = {"backend": backend}
    if backend == "postgres":
        persistence["dsn"] = request.getfixturevalue("postgres_dsn")
    else:
        persistence["path"] = str(tmp_path / "state" / "jobs.db")

    def build(**sections: Any) -> Settings:
        providers = {
            name: {"command": str(FAKES_BIN / binary), "env": {"FAKE_CLI_LOG": str(fake_log.path)}}
            for name, binary in FAKE_COMMANDS.items()
        }
        base: dict[str, Any] = {
            "persistence": dict(persistence),
            "lease": dict(FAST_LEASE),
            "limits": {"kill_grace_s": 1.0},
            "providers": providers,
        }
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        return load_settings(**base)

    return build


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """Start gateways (as the server does) and stop them all at the end of the test."""
    started: list[Gateway] = []

    async def start(settings: Settings, role: str = "stdio") -> Gateway:
        gateway = Gateway(settings, role=role)
        with anyio.fail_after(scaled(20)):
            await gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in reversed(started):
        try:
            with anyio.fail_after(scaled(STOP_BOUND_S)):
                await gateway.stop()
        except TimeoutError:
            raise AssertionError(f"gateway.stop() took over {scaled(STOP_BOUND_S):g} s; the event "
                                 f"loop's tasks then:\n{task_stacks()}") from None


def task_stacks() -> str:
    """Every task of the running loop with where it waits (a stop that hangs names what
    it waits for: a store lock's owner shows up as the task inside the store's methods)."""
    out = []
    for task in asyncio.all_tasks():
        buffer = io.StringIO()
        task.print_stack(limit=12, file=buffer)
        out.append(f"--- {task.get_name()}\n{buffer.getvalue()}")
    return "\n".join(out)
