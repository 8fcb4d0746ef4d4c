"""The unit tier of the job machinery: the manager, its driver, reads, the lease keeper and
the adopter on the memory store, with a fake run in place of a CLI process.

No subprocess and no socket (tests/tiers.py fails a fast test that starts either), so this
folder is in the fast tier (`pytest -m "not slow"`) and a change to the job path is checked
in seconds. What a fake cannot show (process groups, the supervisor, spool records written
by a real run, PostgreSQL's row locks) stays with the slow tests of tests/jobs/.

- `FakeRun`: one run as the driver sees it (gateway/jobs/execution.py `Execution`); the
  test ends it (`finish`) when it wants, or a cancel does.
- `FakeLauncher`: what `JobManager(launch=...)` calls instead of build_execution; it keeps
  every run it made, by job id.
- `StoreClock`: the memory store's clock, which a test can move (leases, dedup windows).
- `managers`: managers (instances) sharing one memory store, drained at the test's end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import pytest

from gateway.config import Settings, load_settings
from gateway.jobs.execution import ExecutionOutcome
from gateway.jobs.manager import JobManager
from gateway.jobs.run.spec import ProcessIdentity
from gateway.jobs.targets import Target
from gateway.model import EXIT_CODES, ErrorKind, GatewayError, InstanceRow
from gateway.store.memory.store import MemoryJobStore
from providers.base import ProviderResult
from tests.conftest import clean_home
from tests.jobs.conftest import FAKES_BIN
from tests.waiting import scaled

HOST = "unit-host"  # every instance of these tests runs "here" unless a test says otherwise
BOOT = "unit-boot"
WAIT_S = 5.0  # the bound of every wait for the job machinery to act (it acts in ms)


class StoreClock:
    """The store's clock: the wall clock plus an offset a test moves. The lease keeper
    compares it with the monotonic clock, so a move after a keeper first read it is a
    clock step to the keeper (which is what a test of clock steps wants)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def move(self, seconds: float) -> None:
        self.offset += seconds


class FakeRun:
    """A run that starts at once, runs until the test finishes it or a cancel stops it, and
    ends with the outcome a CLI run that printed `text` would have."""

    def __init__(self, job_id: str, target: Target, timeout_s: float,
                 start_error: GatewayError | None = None) -> None:
        self.job_id = job_id
        self.target = target
        self.timeout_s = timeout_s
        self.start_error = start_error
        self.started = False
        self.detached = False
        self.cancelled: ErrorKind | None = None
        self.stdout = ""  # what it printed so far (`write`), for progress flushes
        self._outcome: ExecutionOutcome | None = None
        self._ended = asyncio.Event()

    async def start(self) -> ProcessIdentity | None:
        if self.start_error is not None:
            raise self.start_error
        self.started = True
        return None  # no process: nothing for the reaper to probe

    async def wait(self) -> ExecutionOutcome:
        await self._ended.wait()
        assert self._outcome is not None
        return self._outcome

    def finish(self, text: str = "done", error_kind: ErrorKind | None = None,
               is_error: bool = False) -> None:
        """End the run: exit 0 with `text` as its answer, or as `error_kind` says."""
        if self._ended.is_set():
            return
        size = len(text.encode("utf-8"))
        self._outcome = ExecutionOutcome(
            exit_code=0 if error_kind is None else EXIT_CODES.get(error_kind, 1),
            error_kind=error_kind, error=None if error_kind is None else f"ended: {error_kind}",
            output=text, stderr_tail="", output_bytes=size, truncated=False, duration_s=0.01,
            result=ProviderResult(text=text, session_id=f"session-{self.job_id}",
                                  is_error=is_error))
        self._ended.set()

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None:
        self.cancelled = reason
        self.finish("", error_kind=reason)

    def detach(self) -> None:
        self.detached = True

    def write(self, text: str) -> None:
        """The run prints `text` (what a progress flush sends to the row)."""
        self.stdout += text

    @property
    def stdout_bytes(self) -> int:
        return len(self.stdout.encode("utf-8"))

    def read_stdout_tail(self, max_bytes: int) -> str:
        return self.stdout.encode("utf-8")[-max_bytes:].decode("utf-8", errors="ignore")

    def read_stderr_tail(self, max_bytes: int) -> str:
        return ""


class FakeLauncher:
    """Makes a FakeRun for each launch (the `launch` seam of JobManager and JobDriver)."""

    def __init__(self) -> None:
        self.runs: dict[str, FakeRun] = {}
        self.start_error: GatewayError | None = None  # set: the next runs fail to start
        self._launched: dict[str, asyncio.Event] = {}

    def __call__(self, target: Target, job_id: str, spool_dir: Path, timeout_s: float,
                 settings: Settings) -> FakeRun:
        run = FakeRun(job_id, target, timeout_s, self.start_error)
        self.runs[job_id] = run
        self._launched.setdefault(job_id, asyncio.Event()).set()
        return run

    async def run_of(self, job_id: str) -> FakeRun:
        """The run of `job_id` once the driver launched it (bounded: WAIT_S)."""
        with anyio.fail_after(scaled(WAIT_S)):
            await self._launched.setdefault(job_id, asyncio.Event()).wait()
        return self.runs[job_id]


MakeSettings = Callable[..., Settings]


class MakeManager(Protocol):
    """The `managers` fixture: a manager of one instance on the shared memory store."""

    def __call__(self, settings: Settings, instance_id: str = "gw-a", *,
                 hostname: str = HOST, boot_id: str = BOOT,
                 admitting: bool = True) -> JobManager: ...


def identity(instance_id: str, hostname: str = HOST, boot_id: str = BOOT,
             pid: int = 4242) -> InstanceRow:
    """An instance row as a gateway registers it."""
    return InstanceRow(instance_id=instance_id, hostname=hostname, boot_id=boot_id, pid=pid,
                       pid_started_at=None, role="stdio", version="unit")


@pytest.fixture
def unit_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeSettings:
    """Settings on the memory store (the state dir in tmp), claude found at its fake, which
    is never run here; keyword sections override (`limits={"max_running_jobs": 1}`)."""
    clean_home(tmp_path, monkeypatch)

    def build(**sections: Any) -> Settings:
        base: dict[str, Any] = {
            "persistence": {"backend": "memory"},
            "providers": {"claude": {"command": str(FAKES_BIN / "claude")}},
            "limits": {"kill_grace_s": 0.1, "queue_full_wait_s": 0},
        }
        for key, value in sections.items():
            base[key] = {**base.get(key, {}), **value}
        return load_settings(**base)

    return build


@pytest.fixture
def clock() -> StoreClock:
    return StoreClock()


@pytest.fixture
def store(clock: StoreClock) -> MemoryJobStore:
    return MemoryJobStore(clock)


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


@pytest.fixture
async def managers(store: MemoryJobStore, launcher: FakeLauncher) -> AsyncIterator[MakeManager]:
    """Managers on the one store, each launching through the one fake launcher; each is
    drained at the test's end (what it still drives ends, nothing is left pending)."""
    made: list[JobManager] = []

    def make(settings: Settings, instance_id: str = "gw-a", *, hostname: str = HOST,
             boot_id: str = BOOT, admitting: bool = True) -> JobManager:
        manager = JobManager(settings, store, instance_id, hostname, boot_id, launch=launcher)
        if admitting:
            manager.admission.lease_renewed()  # as the lease keeper does once registered
        made.append(manager)
        return manager

    yield make
    for manager in made:
        with anyio.fail_after(scaled(WAIT_S)):
            assert await manager.drain(WAIT_S)
            await manager.remove_settled_spools()
