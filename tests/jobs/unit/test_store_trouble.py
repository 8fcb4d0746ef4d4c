"""The driver and admission when the store fails or fills (gateway/jobs/drive.py,
manager.py) on the memory store made to fail on cue, with a fake run: an admitted job waits
for its store and is never lost, an unconfirmed insert is run only if it was stored, and a
full disk gets a smaller terminal write."""

from __future__ import annotations

import anyio
import pytest

from gateway.backoff import Backoff
from gateway.jobs import drive
from gateway.jobs import manager as manager_module
from gateway.jobs.requests import SubmitRequest
from gateway.model import Completion, ErrorKind, GatewayError, JobRow, JobStatus, NewJob
from gateway.store.base import StoreFull, StoreUnavailable
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import WAIT_S, FakeLauncher, MakeManager, MakeSettings
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

QUICK = Backoff(first_s=0.01, max_s=0.01)  # the retries' waits, so the test takes ms


class TroubledStore(MemoryJobStore):
    """The memory store, whose next calls of a method fail as `trouble[method]` lists: an
    exception raised instead of the call, or, after `"commit"`, raised once it is done (its
    answer lost)."""

    def __init__(self) -> None:
        super().__init__()
        self.trouble: dict[str, list[Exception | str]] = {}

    def _next(self, method: str) -> Exception | str | None:
        queue = self.trouble.get(method)
        return queue.pop(0) if queue else None

    async def insert_job(self, job: NewJob, ttl_s: float) -> JobRow:
        problem = self._next("insert_job")
        if isinstance(problem, Exception):
            raise problem
        row = await super().insert_job(job, ttl_s)
        if problem == "commit":
            raise StoreUnavailable("the connection broke after the commit")
        return row

    async def mark_running(self, job_id: str, owner_instance: str, ttl_s: float) -> bool:
        problem = self._next("mark_running")
        if isinstance(problem, Exception):
            raise problem
        return await super().mark_running(job_id, owner_instance, ttl_s)

    async def complete(self, job_id: str, owner_instance: str,
                       completion: Completion) -> JobRow | None:
        problem = self._next("complete")
        if isinstance(problem, Exception):
            raise problem
        return await super().complete(job_id, owner_instance, completion)


@pytest.fixture
def store() -> TroubledStore:
    """Overrides the unit tier's store: the `managers` fixture builds on this one."""
    return TroubledStore()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drive, "TERMINAL_WRITE_RETRY", QUICK)
    monkeypatch.setattr(drive, "LAUNCH_WRITE_RETRY", QUICK)
    monkeypatch.setattr(manager_module, "ADOPT_RETRY", QUICK)


async def test_the_terminal_write_is_retried_until_the_store_answers(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: TroubledStore,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    store.trouble["complete"] = [StoreUnavailable("down"), StoreUnavailable("still down")]
    (await launcher.run_of(job.id)).finish("kept through the outage")
    row = await manager.reads.wait(job.id, WAIT_S)
    assert row.status is JobStatus.COMPLETED and store.trouble["complete"] == []
    assert (await manager.reads.read_result(job.id)).output == "kept through the outage"


async def test_a_full_store_gets_a_smaller_terminal_write_that_fits(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: TroubledStore,
) -> None:
    manager = managers(unit_settings())
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    store.trouble["complete"] = [StoreFull("disk full")]
    (await launcher.run_of(job.id)).finish("an answer that does not fit")
    row = await manager.reads.wait(job.id, WAIT_S)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.OUTPUT_LIMIT
    assert "disk full" in (row.error or "")


async def test_a_queued_job_waits_for_the_store_to_mark_it_running(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: TroubledStore,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    first = (await manager.submit("claude", SubmitRequest(prompt="first"))).job
    second = (await manager.submit("claude", SubmitRequest(prompt="second"))).job
    store.trouble["mark_running"] = [StoreUnavailable("down"), StoreUnavailable("down")]
    (await launcher.run_of(first.id)).finish()
    run = await launcher.run_of(second.id)  # launched once the store answered
    assert run.started and store.trouble["mark_running"] == []
    run.finish()
    assert (await manager.reads.wait(second.id, WAIT_S)).status is JobStatus.COMPLETED


async def test_an_insert_whose_answer_was_lost_is_run_when_it_was_stored(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: TroubledStore,
) -> None:
    manager = managers(unit_settings())
    store.trouble["insert_job"] = ["commit"]
    with pytest.raises(GatewayError) as unconfirmed:
        await manager.submit("claude", SubmitRequest(prompt="task"))
    assert unconfirmed.value.kind == ErrorKind.UNAVAILABLE
    (row,) = await store.list_jobs()
    run = await launcher.run_of(row.id)  # found stored after all: driven, never left active
    run.finish()
    assert (await manager.reads.wait(row.id, WAIT_S)).status is JobStatus.COMPLETED
    again = await manager.submit("claude", SubmitRequest(prompt="task"))
    assert again.deduplicated and again.job.id == row.id  # the retry joins it


async def test_an_insert_that_failed_stores_nothing_runs_nothing_and_frees_its_slot(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    store: TroubledStore,
) -> None:
    manager = managers(unit_settings(limits={"max_running_jobs": 1}))
    store.trouble["insert_job"] = [StoreUnavailable("down")]
    with pytest.raises(GatewayError) as failed:
        await manager.submit("claude", SubmitRequest(prompt="task"))
    assert failed.value.kind == ErrorKind.UNAVAILABLE
    assert await store.list_jobs() == [] and launcher.runs == {}
    after = await manager.submit("claude", SubmitRequest(prompt="next"))
    assert after.job.status is JobStatus.RUNNING  # the one run slot is free


async def test_a_driver_error_fails_the_job_instead_of_losing_it(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = managers(unit_settings())

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in the launch")

    monkeypatch.setattr(manager._driver, "launch", broken)
    job = (await manager.submit("claude", SubmitRequest(prompt="task"))).job
    row = await manager.reads.wait(job.id, WAIT_S)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.LAUNCH_FAILED
    assert "internal gateway error: a bug in the launch" in (row.error or "")
    assert manager.limiter.snapshot()["running"] == 0


async def test_another_instance_sees_a_running_jobs_output_so_far(
    unit_settings: MakeSettings, managers: MakeManager, launcher: FakeLauncher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drive, "PROGRESS_FLUSH_S", 0.01)
    settings = unit_settings()
    owner, reader = managers(settings, "gw-a"), managers(settings, "gw-b")
    job = (await owner.submit("claude", SubmitRequest(prompt="task"))).job
    run = await launcher.run_of(job.id)
    run.write("first half, ")
    with anyio.fail_after(scaled(WAIT_S)):  # the owner's next flush (every PROGRESS_FLUSH_S)
        while (row := await reader.reads.get(job.id)).output_bytes == 0:
            await anyio.sleep(0.01)
    assert row.status is JobStatus.RUNNING and row.output_bytes == len("first half, ")
    page = await reader.reads.read_result(job.id)
    assert page.output == "first half, " and not page.complete
