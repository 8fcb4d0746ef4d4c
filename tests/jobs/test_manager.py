"""The job manager on a real store (SQLite file and PostgreSQL) with the fake CLIs."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from gateway.jobs import reads as job_reads
from gateway.jobs.manager import JobManager
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run import spool
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus
from providers.parsing import plain_text
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio


def req(prompt: str, **kw: Any) -> SubmitRequest:
    return SubmitRequest(prompt=prompt, **kw)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_request_runs_to_completion_with_the_parsed_answer(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(make_settings())
    manager = await gw.manager()
    sub = await manager.submit("claude", req("hello there"))
    assert not sub.deduplicated
    assert sub.job.status == JobStatus.RUNNING and sub.job.started_at is not None  # a free slot
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.COMPLETED, row.error
    page = await manager.reads.read_result(sub.job.id)
    assert "hello there" in page.output and page.complete and page.next_offset is None
    assert page.parsed and page.parsed["session_id"]


async def test_an_identical_running_request_is_deduplicated_without_a_second_spawn(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    first = await manager.submit("codex", req("work @sleep=1"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    second = await manager.submit("codex", req("work @sleep=1"))
    assert second.deduplicated and second.job.id == first.job.id
    await manager.reads.wait(first.job.id, 20)
    third = await manager.submit("codex", req("work @sleep=1"))  # completed within window
    assert third.deduplicated and third.job.id == first.job.id
    assert len(fake_log.spawns()) == 1


async def test_force_refresh_runs_again(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    a = await manager.submit("grok", req("same"))
    await manager.reads.wait(a.job.id, 20)
    b = await manager.submit("grok", req("same", force_refresh=True))
    assert not b.deduplicated and b.job.id != a.job.id
    await manager.reads.wait(b.job.id, 20)
    assert len(fake_log.spawns()) == 2


async def test_no_dedup_across_prompts_models_working_dirs_or_providers(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, tmp_path: Path
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    other_dir = tmp_path / "wd"
    other_dir.mkdir()
    variants = [
        ("claude", req("p")), ("claude", req("q")), ("claude", req("p", model="sonnet")),
        ("claude", req("p", working_dir=str(other_dir))), ("codex", req("p")),
    ]
    ids = set()
    for provider, request in variants:
        sub = await manager.submit(provider, request)
        assert not sub.deduplicated
        ids.add(sub.job.id)
    for job_id in ids:
        await manager.reads.wait(job_id, 20)
    assert len(ids) == len(variants) == len(fake_log.spawns())


async def test_concurrent_identical_requests_on_two_managers_start_exactly_one_run(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings()
    m1 = await (await start_gateway(settings)).manager()
    m2 = await (await start_gateway(settings)).manager()
    results = []

    async def submit(manager: JobManager) -> None:
        results.append(await manager.submit("claude", req("race me @sleep=0.5")))

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(submit, m1 if i % 2 else m2)
    assert len({r.job.id for r in results}) == 1
    assert sum(not r.deduplicated for r in results) == 1
    await wait_for(lambda: m1.store.get_job(results[0].job.id), 10)
    row = await m1.reads.wait(results[0].job.id, 20)
    if row.status.is_active:  # owned by m2: wait there
        row = await m2.reads.wait(results[0].job.id, 20)
    assert row.status == JobStatus.COMPLETED
    assert len(fake_log.spawns()) == 1
    # A loser of the insert race had made its attempt dir (admitted into a free slot, it
    # would have been inserted running): nothing of it is left.
    spooled = {p.name for p in spool.spool_root(settings.state_dir).iterdir()}
    assert spooled <= {results[0].job.id}


async def test_fifo_order_without_cross_provider_head_of_line_blocking(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    settings = make_settings(limits={"max_running_jobs": 4, "max_running_per_provider": 1})
    manager = await (await start_gateway(settings)).manager()
    hold = await manager.submit("claude", req("hold @sleep=4"))
    await wait_for(lambda: len(fake_log.spawns()) == 1)
    queued = [await manager.submit("claude", req(f"c{i}")) for i in range(3)]
    other = await manager.submit("codex", req("not blocked"))
    # codex runs while claude's queue waits behind its cap
    done = await manager.reads.wait(other.job.id, 20)
    assert done.status == JobStatus.COMPLETED
    assert (await manager.reads.get(queued[0].job.id)).status == JobStatus.QUEUED
    for sub in queued:
        assert (await manager.reads.wait(sub.job.id, 30)).status == JobStatus.COMPLETED
    await manager.reads.wait(hold.job.id, 20)
    claude_prompts = [p for p in fake_log.prompts() if p.startswith("c") and len(p) == 2]
    assert claude_prompts == ["c0", "c1", "c2"]


async def test_queue_timeout_and_saturation(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    settings = make_settings(limits={"max_running_jobs": 1, "max_queued_jobs": 1,
                                     "queue_timeout_s": 0.5, "queue_full_wait_s": 0})
    manager = await (await start_gateway(settings)).manager()
    running = await manager.submit("claude", req("busy @sleep=3"))
    waiting = await manager.submit("claude", req("waits"))
    with pytest.raises(GatewayError) as err:
        await manager.submit("claude", req("one too many"))
    assert err.value.kind == ErrorKind.SATURATED and err.value.retryable
    row = await manager.reads.wait(waiting.job.id, 10)
    assert row.status == JobStatus.FAILED and row.error_kind == ErrorKind.QUEUE_TIMEOUT
    assert row.exit_code == 75
    assert "limits.max_running_jobs" in (row.error or "")
    await manager.cancel(running.job.id)
    assert "waits" not in fake_log.prompts()


async def test_a_request_to_a_full_queue_is_admitted_once_a_run_frees_a_place(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    # A burst larger than the queue is paced by the drain instead of refused (issue #26):
    # the third request waits for the first run to end, then takes the place it freed.
    settings = make_settings(limits={"max_running_jobs": 1, "max_queued_jobs": 1,
                                     "queue_full_wait_s": 600})
    gateway = await start_gateway(settings)
    manager = await gateway.manager()
    first = await manager.submit("claude", req("busy @sleep=0.5"))
    await manager.submit("claude", req("waits"))
    third = await manager.submit("claude", req("one more"))
    assert (await manager.reads.wait(first.job.id, 30)).status == JobStatus.COMPLETED
    assert (await manager.reads.wait(third.job.id, 30)).status == JobStatus.COMPLETED
    assert manager.snapshot()["rejected"] == 0


async def test_a_full_queue_refuses_once_nothing_freed_a_place_within_the_bound(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    settings = make_settings(limits={"max_running_jobs": 1, "max_queued_jobs": 0,
                                     "queue_full_wait_s": 0.2})
    manager = await (await start_gateway(settings)).manager()
    running = await manager.submit("claude", req("busy @sleep=30"))
    with pytest.raises(GatewayError) as err:
        await manager.submit("claude", req("one too many"))
    assert err.value.kind == ErrorKind.SATURATED and err.value.retryable
    assert "limits.queue_full_wait_s" in err.value.message
    assert (await manager.reads.get(running.job.id)).status.is_active  # untouched by the refusal
    await manager.cancel(running.job.id)


async def test_a_queue_timeout_names_the_per_provider_limit_when_that_is_the_one_hit(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    settings = make_settings(limits={"max_running_jobs": 8, "max_running_per_provider": 1,
                                     "queue_timeout_s": 0.5})
    manager = await (await start_gateway(settings)).manager()
    running = await manager.submit("claude", req("busy @sleep=3"))
    waiting = await manager.submit("claude", req("waits"))
    row = await manager.reads.wait(waiting.job.id, 10)
    assert row.error_kind == ErrorKind.QUEUE_TIMEOUT
    assert "raise limits.max_running_per_provider" in (row.error or "")
    assert "max_running_jobs" not in (row.error or "")
    await manager.cancel(running.job.id)


async def test_an_insert_failure_fails_the_request_with_nothing_left_running(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog
) -> None:
    gw = await start_gateway(make_settings())
    manager = await gw.manager()
    await manager.store.close()
    with pytest.raises(GatewayError) as err:
        await manager.submit("claude", req("never runs", force_refresh=True))
    assert err.value.kind == ErrorKind.UNAVAILABLE
    assert manager.limiter.snapshot()["running"] == 0
    assert manager.local_job_ids() == []
    assert fake_log.spawns() == []


async def test_cancel_of_a_queued_job_never_spawns_it(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    settings = make_settings(limits={"max_running_jobs": 1})
    manager = await (await start_gateway(settings)).manager()
    busy = await manager.submit("claude", req("busy @sleep=2"))
    queued = await manager.submit("claude", req("queued one"))
    out = await manager.cancel(queued.job.id)
    assert out.outcome == "cancelled" and out.job.status == JobStatus.CANCELLED
    await manager.cancel(busy.job.id)
    assert "queued one" not in fake_log.prompts()


async def test_cancel_of_a_running_job_kills_its_whole_group(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", req("stubborn @ignore-term @grandchild=60 @sleep=60"))
    await wait_for(lambda: any("grandchild_pid" in e for e in fake_log.entries()))
    out = await manager.cancel(sub.job.id)
    assert out.job.status == JobStatus.CANCELLED
    pids = [e["pid"] for e in fake_log.spawns()] + [
        e["grandchild_pid"] for e in fake_log.entries() if "grandchild_pid" in e]
    await wait_for(lambda: not any(alive(p) for p in pids), 10)


async def test_result_paging_across_a_multi_mib_output(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("gemini", req("@bytes=3000000 big"))
    row = await manager.reads.wait(sub.job.id, 30)
    assert row.status == JobStatus.COMPLETED, row.error
    pieces, offset = [], 0
    while True:
        page = await manager.reads.read_result(sub.job.id, offset=offset, max_bytes=700_000, raw=True)
        pieces.append(page.output)
        if page.next_offset is None:
            break
        offset = page.next_offset
    assert len(pieces) >= 5 and page.complete
    stored = await manager.store.get_job(sub.job.id)  # the wait's row is light: no output
    assert stored is not None and row.output is None
    assert "".join(pieces) == stored.output and page.total_bytes >= 3_000_000


async def test_a_plain_text_answer_is_stored_once_as_a_range_of_the_output(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("devin", req("@bytes=600000 plain"))  # devin prints text
    row = await manager.reads.wait(sub.job.id, 30)
    assert row.status == JobStatus.COMPLETED, row.error
    stored = await manager.store.get_job(sub.job.id)
    assert stored is not None and stored.output is not None and stored.result_json
    parsed = json.loads(stored.result_json)
    assert "text" not in parsed and parsed["text_span"][1] > 600_000  # no second copy
    pieces, offset = [], 0
    while True:
        page = await manager.reads.read_result(sub.job.id, offset=offset, max_bytes=200_000)
        pieces.append(page.output)
        if page.next_offset is None:
            break
        offset = page.next_offset
    assert "".join(pieces) == plain_text(stored.output) and page.complete
    assert "fake-devin answer" in pieces[-1]


async def test_a_stream_past_the_output_limit_is_truncated_and_pages_the_capped_output(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    limit = 1_000_000
    settings = make_settings(limits={"max_output_bytes": limit})
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", req("@bytes=3000000 flood"))
    row = await manager.reads.wait(sub.job.id, 30)
    assert (row.status, row.error_kind, row.truncated) == (
        JobStatus.FAILED, ErrorKind.OUTPUT_LIMIT, True)
    stored = await manager.store.get_job(sub.job.id)
    assert stored is not None and stored.output == "x" * limit  # the first bytes, no more
    assert stored.output_bytes == limit
    for raw in (True, False):  # the raw output, and the answer (all of it, as plain text)
        pieces, offset = [], 0
        while True:
            page = await manager.reads.read_result(sub.job.id, offset=offset, max_bytes=300_000,
                                             raw=raw)
            pieces.append(page.output)
            if page.next_offset is None:
                break
            offset = page.next_offset
        assert "".join(pieces) == stored.output and page.total_bytes == limit


async def test_small_pages_of_a_finished_answer_never_split_a_character(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    # Pages of a finished job are cut in the store, with a few bytes around them: every
    # page must still start and end on a character, even one smaller than a character.
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", req("añ€𝄞 " * 12))  # 2-, 3- and 4-byte characters
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.COMPLETED, row.error
    whole = (await manager.reads.read_result(sub.job.id)).output
    assert "añ€𝄞 añ€𝄞" in whole
    for max_bytes in (1, 3, 5):
        pieces, offset = [], 0
        while True:
            page = await manager.reads.read_result(sub.job.id, offset=offset, max_bytes=max_bytes)
            assert page.output and "\ufffd" not in page.output
            pieces.append(page.output)
            if page.next_offset is None:
                break
            offset = page.next_offset
        assert "".join(pieces) == whole and page.complete


async def test_a_wait_past_the_deferral_deadline_returns_and_the_job_still_completes(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", req("slow @sleep=1.5"))
    row = await manager.reads.wait(sub.job.id, 0.3)
    assert row.status == JobStatus.RUNNING
    assert (await manager.reads.wait(sub.job.id, 20)).status == JobStatus.COMPLETED


async def test_a_sync_answer_and_a_wait_on_an_ended_job_read_the_row_once(
    make_settings: MakeSettings, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each store round trip is on the path of every short request (issue #26): the driver's
    # terminal write hands its row to the waiter, and a caller that has the row passes it on.
    # The wait also re-reads a running job's row every REMOTE_POLL_S (its progress): on a
    # loaded box a run can outlast that, so the poll is put out of this test's way.
    monkeypatch.setattr(job_reads, "REMOTE_POLL_S", 3600.0)
    manager = await (await start_gateway(make_settings())).manager()
    reads: list[str] = []
    real_get = manager.store.get_job

    async def counted(job_id: str, *, with_output: bool = True) -> JobRow | None:
        reads.append(job_id)
        return await real_get(job_id, with_output=with_output)

    monkeypatch.setattr(manager.store, "get_job", counted)
    sub = await manager.submit("claude", req("answer once"))
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status is JobStatus.COMPLETED and reads == [sub.job.id]  # its first look only
    reads.clear()
    seen = await manager.reads.get(sub.job.id)
    assert (await manager.reads.wait(sub.job.id, 20, read=seen)) == seen and len(reads) == 1


async def test_results_survive_closing_and_reopening_on_the_same_store(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    settings = make_settings()
    gw = await start_gateway(settings)
    manager = await gw.manager()
    sub = await manager.submit("claude", req("remember me"))
    await manager.reads.wait(sub.job.id, 20)
    await gw.stop()
    manager2 = await (await start_gateway(settings)).manager()
    page = await manager2.reads.read_result(sub.job.id)
    assert "remember me" in page.output and page.job.status == JobStatus.COMPLETED


async def test_unknown_job_ids_and_bad_input_are_clear_errors(
    make_settings: MakeSettings, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    cases: list[Callable[[], Awaitable[object]]] = [
        lambda: manager.reads.get("nope"),
        lambda: manager.submit("claude", req("")),
        lambda: manager.submit("claude", req("a\x00b")),
        lambda: manager.submit("claude", req("x", working_dir=str(tmp_path / "missing"))),
        lambda: manager.submit("claude", req("x", working_dir="relative/dir")),
        lambda: manager.submit("nosuch", req("x")),
        lambda: manager.submit("claude", req("x", timeout_s=-1)),
        lambda: manager.reads.read_result("nope"),
    ]
    for case in cases:
        with pytest.raises(GatewayError) as err:
            await case()
        assert err.value.kind in (ErrorKind.INVALID_INPUT, ErrorKind.JOB_NOT_FOUND)
        assert err.value.message
    assert await manager.reads.list_jobs() == []


async def test_idle_timeout_applies_only_to_runs_that_stream(
    make_settings: MakeSettings, start_gateway: StartGateway,
) -> None:
    """CLIs (or output formats) that print nothing until they exit are never idle-killed;
    a streaming run that goes silent is."""
    manager = await (await start_gateway(make_settings(limits={"idle_timeout_s": 0.5}))).manager()
    quiet = [
        await manager.submit("gemini", req("think quietly @sleep=1.5")),
        await manager.submit("claude", req("json at exit @sleep=1.5",
                                           options={"output_format": "json"})),
    ]
    streaming = await manager.submit("codex", req("then silence @sleep=3"))
    for sub in quiet:
        row = await manager.reads.wait(sub.job.id, 20)
        assert row.status == JobStatus.COMPLETED, (row.provider, row.error)
    row = await manager.reads.wait(streaming.job.id, 20)
    assert row.status == JobStatus.TIMED_OUT and row.error_kind == ErrorKind.IDLE_TIMEOUT
    assert row.exit_code == 125


async def test_regression_a_caller_that_gives_up_mid_admission_never_leaves_a_job_queued_forever(
    make_settings: MakeSettings, start_gateway: StartGateway
) -> None:
    """The chaos run found it on PostgreSQL: a client timing out while the INSERT was in
    flight cancelled the submit after the row committed; nothing drove the row and the
    owner's heartbeat kept it `queued` for ever. Admission is now shielded."""
    manager = await (await start_gateway(make_settings())).manager()
    for i in range(40):
        with anyio.move_on_after((i % 8) * 0.0007):
            await manager.submit("claude", req(f"impatient {i}"))

    async def none_active() -> bool:
        rows = await manager.reads.list_jobs(limit=100)
        return all(r.status.is_terminal for r in rows)

    await wait_for(none_active, 30)
    rows = await manager.reads.list_jobs(limit=100)
    assert rows and all(r.status == JobStatus.COMPLETED for r in rows)


async def test_every_directory_the_gateway_creates_is_0700_on_both_backends(
        make_settings: MakeSettings, start_gateway: StartGateway, backend: str) -> None:
    old_umask = os.umask(0o022)  # the usual umask: mkdir alone would leave 0755
    try:
        settings = make_settings()
        manager = await (await start_gateway(settings)).manager()
        sub = await manager.submit("claude", req("hold @sleep=2"))
        spool = settings.state_dir / "spool" / sub.job.id / "0"
        await wait_for(spool.exists)
        created = [spool, spool.parent, spool.parent.parent, settings.state_dir]
        if backend == "postgres":
            created.append(settings.state_dir.parent)  # HOME itself did not exist either
        for directory in created:
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        await manager.cancel(sub.job.id)
    finally:
        os.umask(old_umask)


async def test_a_working_dir_too_long_for_the_kernel_is_invalid_input_not_internal_error(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    too_long = ["/" + "a" * 5000,  # one component over NAME_MAX
                "/" + "/".join(["b" * 200] * 25)]  # each fine, the whole over PATH_MAX
    for working_dir in too_long:
        with pytest.raises(GatewayError) as err:
            await manager.submit("claude", req("x", working_dir=working_dir))
        assert err.value.kind == ErrorKind.INVALID_INPUT
        assert "working_dir" in err.value.message and len(err.value.message) < 600
    assert await manager.reads.list_jobs() == []


async def test_a_result_offset_of_2_62_on_a_running_job_is_an_empty_page_not_memory_error(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", req("hold @sleep=3"))
    await wait_for(lambda: manager.reads.get(sub.job.id), 10)
    await wait_for(async_status(manager, sub.job.id, JobStatus.RUNNING))
    for offset in (2**62, 2**70):
        page = await manager.reads.read_result(sub.job.id, offset=offset, max_bytes=2**62)
        assert page.output == "" and not page.complete
    await manager.cancel(sub.job.id)
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status.is_terminal
    page = await manager.reads.read_result(sub.job.id, offset=2**70, max_bytes=2**62)
    assert page.output == "" and page.next_offset is None


def async_status(manager: Any, job_id: str, status: JobStatus) -> Any:
    async def check() -> bool:
        row = await manager.reads.get(job_id)
        return bool(row.status == status)
    return check


async def test_an_unusable_state_dir_fails_the_run_with_a_clear_launch_error(
        make_settings: MakeSettings, start_gateway: StartGateway, backend: str, tmp_path: Path) -> None:
    """The spool directory cannot be made (here a file is in the way: ENOTDIR, the same
    OSError path as EACCES, which root, running these tests, never gets)."""
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    manager.spool_root.parent.mkdir(parents=True, exist_ok=True)
    if manager.spool_root.is_dir():
        manager.spool_root.rmdir()
    manager.spool_root.write_text("not a directory")
    sub = await manager.submit("claude", req("never runs"))
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.FAILED
    assert row.error_kind == ErrorKind.LAUNCH_FAILED
    assert "state directory" in (row.error or "")


@pytest.mark.parametrize("timeout_s", [1e308, float("inf"), float("nan"), 604_801, 0, -1])
async def test_timeout_s_beyond_one_week_or_not_a_number_is_invalid_input(
        make_settings: MakeSettings, start_gateway: StartGateway, timeout_s: float) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    with pytest.raises(GatewayError) as err:
        await manager.submit("claude", req("x", timeout_s=timeout_s))
    assert err.value.kind == ErrorKind.INVALID_INPUT
    assert "at most 604800" in err.value.message
    assert await manager.reads.list_jobs() == []


async def test_max_prompt_bytes_bounds_the_whole_request_messages_and_system_too(
        make_settings: MakeSettings, start_gateway: StartGateway) -> None:
    api = {"fake": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                    "default_model": "m"}}
    manager = await (await start_gateway(make_settings(
        limits={"max_prompt_bytes": 1000}, api_providers=api))).manager()
    big = "x" * 1200
    over = [
        ("fake", SubmitRequest(options={"messages": [{"role": "user", "content": big}]})),
        ("fake", SubmitRequest(options={"messages": [{"role": "user", "content": "a" * 600},
                                                     {"role": "assistant", "content": "b" * 600},
                                                     {"role": "user", "content": "go"}]})),
        ("fake", SubmitRequest(prompt="hi", options={"system": big})),
        ("claude", SubmitRequest(prompt="p" * 900, model="m" * 200)),
    ]
    for provider_name, request in over:
        with pytest.raises(GatewayError) as err:
            await manager.submit(provider_name, request)
        assert err.value.kind == ErrorKind.INVALID_INPUT, provider_name
        assert "max_prompt_bytes" in err.value.message
    assert await manager.reads.list_jobs() == []
