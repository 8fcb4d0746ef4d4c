"""What the store contract suite shares (tests/store/test_contract_*.py): the rows a test
writes, the moves it makes on a store (a running job, a reaper's sweep, an orphaned job) and
the waits on the store's own clock. Time rules use the store's clock (`store.now()`): a test
waits until that clock has passed a moment, never a fixed sleep. A lease written with a
negative ttl is one that is already over, so expiry needs no wait.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

import anyio

from gateway.model import (
    Completion,
    InstanceRow,
    JobRow,
    JobStatus,
    NewJob,
)
from gateway.store.base import JobStore
from tests.waiting import scaled

OWNER = "instance-a"
OTHER = "instance-b"
TTL_S = 60.0  # a lease that cannot run out during a test
EXPIRED_TTL_S = -5.0  # a lease that is already over when written: expiry without waiting
HTTP_GRACE_S = 60.0  # an http job whose lease lapsed is still inside this grace
PAST_S = 0.3  # how far a test lets the store clock move past a moment before comparing
WINDOW_S = 0.15  # a window/threshold shorter than PAST_S, so that moment is outside it
RACE_ROUNDS = 100  # iterations of each two-connection race
RACE_TTL_S = 0.5  # the lease in the heartbeat-vs-reaper race: short, so expiry is real
RACE_HEARTBEAT_EVERY_S = 0.05  # the racing owner heartbeats ten times per ttl
RACE_RECOVER_EVERY_S = 0.005  # the racing reaper sweeps as often as it can
RACE_LIMIT_S = 60.0  # a race that takes longer than this is a hang
STORE_TIME_POLL_S = 0.02  # how often a wait re-reads the store clock
STORE_TIME_WAIT_LIMIT_S = 10.0  # a wait for the store clock that takes longer is a hang


# -- helpers ------------------------------------------------------------------------------

def new_job(
    *, owner: str = OWNER, key: str | None = None, provider: str = "claude",
    transport: str = "process", forced: bool = False, principal: str | None = None,
) -> NewJob:
    return NewJob(
        id=str(uuid.uuid4()),
        provider=provider,
        request_key=key or f"key-{uuid.uuid4().hex}",
        owner_instance=owner,
        transport=transport,
        correlation_id=f"corr-{uuid.uuid4().hex[:8]}",
        hostname="host-1",
        boot_id="boot-1",
        working_dir="/tmp/work",
        model="model-x",
        session_id="session-1",
        request_json='{"prompt": "hi"}',
        forced=forced,
        principal=principal,
    )


def instance(instance_id: str, **changes: object) -> InstanceRow:
    row = InstanceRow(
        instance_id=instance_id, hostname="host-1", boot_id="boot-1", pid=4242,
        pid_started_at=1_700_000_000.5, role="stdio", version="0.1.0",
    )
    for name, value in changes.items():
        setattr(row, name, value)
    return row


def done(status: JobStatus = JobStatus.COMPLETED, **changes: object) -> Completion:
    completion = Completion(status=status, exit_code=0 if status is JobStatus.COMPLETED else 1)
    for name, value in changes.items():
        setattr(completion, name, value)
    return completion


def epoch(moment: datetime | None) -> float:
    assert moment is not None
    offset = moment.utcoffset()
    assert offset is not None and offset.total_seconds() == 0
    return moment.timestamp()


async def wait_for_store_time(store: JobStore, target_epoch_s: float) -> None:
    """Wait until the store's own clock has passed `target_epoch_s` (bounded)."""
    with anyio.fail_after(scaled(STORE_TIME_WAIT_LIMIT_S)):
        while await store.now() <= target_epoch_s:
            await anyio.sleep(STORE_TIME_POLL_S)


async def running(store: JobStore, job: NewJob, ttl_s: float = TTL_S) -> JobRow:
    await store.insert_job(job, ttl_s)
    assert await store.mark_running(job.id, job.owner_instance, ttl_s)
    assert await store.record_process(job.id, job.owner_instance, 100, 100, 1.5)
    row = await store.get_job(job.id)
    assert row is not None
    return row


async def get(store: JobStore, job_id: str) -> JobRow:
    row = await store.get_job(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row


async def reap(store: JobStore, http_grace_s: float, alive: Sequence[str] = (),
               orphaned_by: str | None = None) -> list[JobRow]:
    """One sweep as the reaper does it: list the candidates, then orphan those judged (all
    but the `alive` ones), by a reaper of host `orphaned_by`."""
    candidates = await store.list_expired_candidates(http_grace_s)
    judged = [row.id for row in candidates if row.id not in alive]
    return await store.recover_expired_leases(http_grace_s, judged, orphaned_by)


async def orphaned(store: JobStore, job: NewJob, *, run: bool = True) -> JobRow:
    """A job whose lease ran out and that the reaper recovered."""
    await store.insert_job(job, EXPIRED_TTL_S)
    if run:
        assert await store.mark_running(job.id, job.owner_instance, EXPIRED_TTL_S)
    flipped = await reap(store, HTTP_GRACE_S)
    assert job.id in {r.id for r in flipped}
    return await get(store, job.id)


async def output_page(store: JobStore, job_id: str, offset: int, length: int, *,
                      answer: bool = False) -> tuple[bytes, int]:
    """A page of a job whose output the test wrote (absent output fails the test here)."""
    page = await store.read_output(job_id, offset, length, answer=answer)
    assert page is not None, f"job {job_id} has no output"
    return page


async def race(round_no: int, one: Callable[[], Coroutine[Any, Any, None]],
               other: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run both at once, started in the one order on odd rounds and the other on even."""
    async with anyio.create_task_group() as tg:
        for task in (one, other) if round_no % 2 else (other, one):
            tg.start_soon(task)
