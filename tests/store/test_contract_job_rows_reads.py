"""The JobRows role on every backend: retention, reads (light and whole), pages of output.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gateway.model import (
    OUTPUT_CHUNK_BYTES,
    JobStatus,
    OutputFile,
    OutputFileError,
)
from gateway.store.base import JobStore
from tests.store.contract_helpers import (
    EXPIRED_TTL_S,
    OTHER,
    OWNER,
    PAST_S,
    TTL_S,
    WINDOW_S,
    done,
    epoch,
    get,
    instance,
    new_job,
    orphaned,
    output_page,
    running,
    wait_for_store_time,
)

pytestmark = pytest.mark.anyio


# -- retention and reads ------------------------------------------------------------------

async def test_purge_terminal_deletes_only_terminal_rows_past_retention(store: JobStore) -> None:
    old_done = await running(store, new_job())
    assert await store.complete(old_done.id, OWNER, done())
    old_orphan = await orphaned(store, new_job())
    old_active = new_job()
    await store.insert_job(old_active, TTL_S)
    await store.insert_job(new_job(), EXPIRED_TTL_S)  # expired but never recovered: active
    mark = await get(store, old_done.id)
    orphan_row = await get(store, old_orphan.id)
    await wait_for_store_time(
        store, max(epoch(mark.finished_at), epoch(orphan_row.finished_at)) + PAST_S
    )
    fresh_done = await running(store, new_job())
    assert await store.complete(fresh_done.id, OWNER, done(JobStatus.FAILED))

    assert await store.purge_terminal(3600) == []
    assert sorted(await store.purge_terminal(WINDOW_S)) == sorted([old_done.id, old_orphan.id])
    assert await store.get_job(old_done.id) is None
    assert await store.get_job(old_orphan.id) is None
    assert (await get(store, old_active.id)).status is JobStatus.QUEUED
    assert (await get(store, fresh_done.id)).status is JobStatus.FAILED
    assert len(await store.list_jobs()) == 3


async def test_purge_terminal_deletes_a_bounded_batch(store: JobStore) -> None:
    ended = []
    for _ in range(3):
        job = await running(store, new_job())
        assert await store.complete(job.id, OWNER, done())
        ended.append(await get(store, job.id))
    await wait_for_store_time(store, max(epoch(j.finished_at) for j in ended) + PAST_S)
    first = await store.purge_terminal(WINDOW_S, limit=2)
    second = await store.purge_terminal(WINDOW_S, limit=2)  # fewer than the limit: all gone
    assert (len(first), len(second)) == (2, 1)
    assert sorted(first + second) == sorted(j.id for j in ended)
    assert await store.purge_terminal(WINDOW_S, limit=2) == []


async def test_find_job_ids_matches_a_prefix_literally_sorted_and_bounded(
    store: JobStore,
) -> None:
    ids = ["abc12345-0000", "abc12345-1111", "abd00000-0000", "ab%_x-0000", "ABC12345-2222"]
    for job_id in ids:
        job = new_job()
        job.id = job_id
        await store.insert_job(job, TTL_S)

    assert await store.find_job_ids("abc1") == ["abc12345-0000", "abc12345-1111"]
    assert await store.find_job_ids("abc12345-1111") == ["abc12345-1111"]  # a whole id
    assert await store.find_job_ids("abc", limit=1) == ["abc12345-0000"]
    assert await store.find_job_ids("ABC") == ["ABC12345-2222"]  # case-sensitive
    # LIKE's wildcards are characters here: `_` is not "any one", `%` not "anything".
    assert await store.find_job_ids("ab_") == []
    assert await store.find_job_ids("ab%") == ["ab%_x-0000"]
    assert await store.find_job_ids("ab%_") == ["ab%_x-0000"]
    assert await store.find_job_ids("zzz") == []
    assert await store.find_job_ids("") == []


async def test_get_job_of_an_unknown_id_is_none(store: JobStore) -> None:
    assert await store.get_job("no-such-job") is None


async def test_list_jobs_filters_and_lists_newest_first(store: JobStore) -> None:
    a = await store.insert_job(new_job(provider="claude"), TTL_S)
    b = await running(store, new_job(provider="codex"))
    c = await running(store, new_job(provider="claude", owner=OTHER))
    assert await store.complete(c.id, OTHER, done())
    d = await store.insert_job(new_job(provider="gemini", owner=OTHER), TTL_S)

    assert [r.id for r in await store.list_jobs()] == [d.id, c.id, b.id, a.id]
    assert [r.id for r in await store.list_jobs(limit=2)] == [d.id, c.id]
    assert [r.id for r in await store.list_jobs(provider="claude")] == [c.id, a.id]
    assert [r.id for r in await store.list_jobs(owner_instance=OTHER)] == [d.id, c.id]
    assert [r.id for r in await store.list_jobs(statuses=[JobStatus.QUEUED])] == [d.id, a.id]
    active = await store.list_jobs(statuses=[JobStatus.QUEUED, JobStatus.RUNNING])
    assert [r.id for r in active] == [d.id, b.id, a.id]
    both = await store.list_jobs(
        statuses=[JobStatus.QUEUED], provider="claude", owner_instance=OWNER
    )
    assert [r.id for r in both] == [a.id]
    assert await store.list_jobs(provider="nobody") == []


async def test_list_jobs_filters_by_principal_before_the_limit_so_a_page_is_full(
    store: JobStore,
) -> None:
    # #23: a listing filtered after the LIMIT came back short (or empty) when another
    # principal's jobs were newer; filtered in the query, each page is full.
    old = await store.insert_job(new_job(), TTL_S)  # from before schema 4: no principal
    mine = [await store.insert_job(new_job(principal="token:alice"), TTL_S) for _ in range(3)]
    theirs = [await store.insert_job(new_job(principal="token:bob"), TTL_S) for _ in range(4)]

    page = await store.list_jobs(principal="token:alice", limit=2)
    assert [r.id for r in page] == [mine[2].id, mine[1].id]
    everything = await store.list_jobs(principal="token:alice", limit=10, with_output=False)
    assert [r.id for r in everything] == [j.id for j in reversed(mine)]
    with_old = await store.list_jobs(principal="token:alice", unowned_too=True, limit=10)
    assert [r.id for r in with_old] == [j.id for j in reversed(mine)] + [old.id]
    assert [r.id for r in await store.list_jobs(principal="local", unowned_too=True)] == [old.id]
    bobs = await store.list_jobs(principal="token:bob", provider="claude", limit=4)
    assert [r.id for r in bobs] == [j.id for j in reversed(theirs)]
    assert len(await store.list_jobs(limit=100)) == 8  # no principal: every job


async def test_a_light_read_leaves_out_the_output_and_the_answer_text_only(
    store: JobStore,
) -> None:
    # Status, wait, list and cancel read rows whose output (and parsed answer, which is
    # output too) can be max_output_bytes; they need neither, so neither is read.
    answer = {"text": "the answer é", "session_id": "native-1",
              "usage": {"input_tokens": 3}, "duration_s": 1.25, "extra": {"k": "\u0000"}}
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        output="raw stdout é", output_bytes=14, stderr_tail="trace",
        result_json=json.dumps(answer, sort_keys=True, separators=(",", ":"))))
    queued = await store.insert_job(new_job(), TTL_S)
    weird = await running(store, new_job())  # result_json that is not JSON: kept as it is
    assert await store.complete(weird.id, OWNER, done(output="out", result_json="not json"))

    full = await get(store, job.id)
    light = await store.get_job(job.id, with_output=False)
    assert light is not None and light.output is None
    assert light.result_json is not None
    assert json.loads(light.result_json) == {k: v for k, v in answer.items() if k != "text"}
    assert dataclasses.replace(light, output=full.output, result_json=full.result_json) == full
    assert await store.get_job("no-such-job", with_output=False) is None

    light_queued = await store.get_job(queued.id, with_output=False)
    assert light_queued == await get(store, queued.id)  # nothing to leave out
    light_weird = await store.get_job(weird.id, with_output=False)
    assert light_weird is not None
    assert (light_weird.output, light_weird.result_json) == (None, "not json")

    listed = {r.id: r for r in await store.list_jobs(with_output=False)}
    assert listed.keys() == {job.id, queued.id, weird.id}
    assert listed[job.id] == light and listed[weird.id] == light_weird
    assert [r.id for r in await store.list_jobs(with_output=False, limit=1)] == [weird.id]


async def test_dedup_lookup_and_cancel_answer_with_light_rows(store: JobStore) -> None:
    """Admission's dedup lookup and a cancel answer with a job's id and status: a finished
    job's output (up to max_output_bytes) is not read for them."""
    answer = {"text": "the answer", "session_id": "native-1"}
    job = await running(store, new_job(key="dedup-light"))
    assert await store.complete(job.id, OWNER, done(
        output="raw stdout", output_bytes=10,
        result_json=json.dumps(answer, sort_keys=True, separators=(",", ":"))))
    light = await store.get_job(job.id, with_output=False)

    reused = await store.find_reusable("dedup-light", 3600)
    after_cancel = await store.request_cancel(job.id)

    assert reused == light and after_cancel == light
    assert reused is not None and reused.output is None
    active = await running(store, new_job())
    cancelled = await store.request_cancel(active.id)
    assert cancelled is not None and cancelled.cancel_requested_at is not None
    assert cancelled == await store.get_job(active.id, with_output=False)


async def test_read_output_pages_the_output_or_the_answer_in_bytes(store: JobStore) -> None:
    output = "héllo wörld " * 1000  # multi-byte characters: offsets are bytes, not chars
    data = output.encode()
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        output=output, output_bytes=len(data),
        result_json=json.dumps({"text": "the ánswer", "session_id": None})))
    no_text = await running(store, new_job())
    assert await store.complete(no_text.id, OWNER, done(
        output="stdout only", result_json=json.dumps({"text": "", "session_id": "s"})))
    nothing = await store.insert_job(new_job(), TTL_S)

    assert await store.read_output(job.id, 0, 10) == (data[:10], len(data))
    assert await store.read_output(job.id, 2, 3) == (data[2:5], len(data))  # mid-character
    assert await store.read_output(job.id, len(data) - 4, 100) == (data[-4:], len(data))
    assert await store.read_output(job.id, len(data) + 5, 10) == (b"", len(data))
    pages = [(await output_page(store, job.id, off, 997))[0] for off in range(0, len(data), 997)]
    assert b"".join(pages) == data

    answer = "the ánswer".encode()
    assert await store.read_output(job.id, 0, 100, answer=True) == (answer, len(answer))
    assert await store.read_output(job.id, 5, 3, answer=True) == (answer[5:8], len(answer))
    # An empty answer text, or no row text at all, pages the output instead.
    assert await store.read_output(no_text.id, 0, 6, answer=True) == (b"stdout", 11)
    assert await store.read_output(nothing.id, 0, 10, answer=True) == (b"", 0)
    assert await store.read_output(nothing.id, 0, 10) == (b"", 0)
    assert await store.read_output("no-such-job", 0, 10) is None
    assert await store.read_output("no-such-job", 0, 10, answer=True) is None


async def test_an_answer_stored_as_a_range_of_the_output_pages_that_range(
    store: JobStore,
) -> None:
    # An answer that is (a slice of) the output is stored once: result_json names its bytes.
    output = "banner\nthe ánswer 𝄞\n\n"
    data = output.encode()
    start, end = 7, len("banner\nthe ánswer 𝄞".encode())
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output=output, result_json=json.dumps(
        {"text_span": [start, end], "session_id": "s", "extra": {"k": "\u0000"}})))
    answer = data[start:end]
    assert await store.read_output(job.id, 0, 100, answer=True) == (answer, len(answer))
    assert await store.read_output(job.id, 4, 3, answer=True) == (answer[4:7], len(answer))
    assert await store.read_output(job.id, 50, 3, answer=True) == (b"", len(answer))
    assert await store.read_output(job.id, 0, 100) == (data, len(data))  # raw: all of it
    pages = [(await output_page(store, job.id, off, 2, answer=True))[0]
             for off in range(0, len(answer), 2)]
    assert b"".join(pages) == answer
    # A range past the end is cut at the end; a range that is not one pages the output.
    for span, expected in (([start, 10_000], data[start:]), ([3, 3], data), (["a", 9], data),
                           ([-1, 4], data), ([2.5, 9], data)):
        odd = await running(store, new_job())
        assert await store.complete(odd.id, OWNER, done(
            output=output, result_json=json.dumps({"text_span": span})))
        assert await store.read_output(odd.id, 0, 100, answer=True) == (expected, len(expected))


def large_output(tmp_path: Path, name: str, size: int) -> tuple[str, OutputFile]:
    """A valid UTF-8 output of about `size` bytes, its characters of 1 to 4 bytes falling
    across every piece boundary, as an OutputFile."""
    unit = "ab é € 𝄞\n"
    text = unit * (size // len(unit.encode()) + 1)
    path = tmp_path / name
    path.write_bytes(text.encode())
    return text, OutputFile(path, path.stat().st_size)


async def test_a_large_output_is_written_in_pieces_and_reads_back_byte_exact(
    store: JobStore, tmp_path: Path,
) -> None:
    text, source = large_output(tmp_path, "stdout", 3 * OUTPUT_CHUNK_BYTES + 12_345)
    data = text.encode()
    assert not source.small
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(
        JobStatus.FAILED, error_kind="output_limit", output=source, output_bytes=len(data),
        truncated=True, result_json=json.dumps({"text_span": [3, len(data) - 1]})))

    row = await get(store, job.id)
    assert (row.status, row.truncated, row.output_bytes) == (JobStatus.FAILED, True, len(data))
    assert row.output == text
    light = await store.get_job(job.id, with_output=False)
    assert light is not None and light.output is None and light.truncated
    pages, offset = [], 0
    while offset < len(data):
        page, total = await store.read_output(job.id, offset, 300_007) or (b"", -1)
        assert total == len(data) and page
        pages.append(page)
        offset += len(page)
    assert b"".join(pages) == data
    assert await store.read_output(job.id, len(data) - 5, 100) == (data[-5:], len(data))
    answer = data[3:-1]
    assert await store.read_output(job.id, 0, 10, answer=True) == (answer[:10], len(answer))
    assert await store.read_output(job.id, len(answer) - 4, 10, answer=True) == (
        answer[-4:], len(answer))


async def test_a_large_output_that_loses_the_cas_changes_nothing(
    store: JobStore, tmp_path: Path,
) -> None:
    first_text, first = large_output(tmp_path, "first", 2 * OUTPUT_CHUNK_BYTES)
    _, late = large_output(tmp_path, "late", 2 * OUTPUT_CHUNK_BYTES + 99)
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output=first))
    assert not await store.complete(job.id, OWNER, done(JobStatus.FAILED, output=late))
    row = await get(store, job.id)
    assert (row.status, row.output) == (JobStatus.COMPLETED, first_text)


async def test_an_output_file_that_cannot_be_read_back_leaves_the_row_active(
    store: JobStore, tmp_path: Path,
) -> None:
    # The status and the output commit together or not at all.
    _, source = large_output(tmp_path, "stdout", 2 * OUTPUT_CHUNK_BYTES)
    job = await running(store, new_job())
    for broken in (OutputFile(source.path, source.size + 10),  # shorter than measured
                   OutputFile(tmp_path / "gone", source.size),
                   OutputFile(tmp_path / "gone", 10)):  # small: read whole, same rule
        with pytest.raises(OutputFileError):
            await store.complete(job.id, OWNER, done(output=broken))
        row = await get(store, job.id)
        assert (row.status, row.output, row.finished_at) == (JobStatus.RUNNING, None, None)
    assert await store.complete(job.id, OWNER, done(output=source))
    assert (await get(store, job.id)).output == source.text()


async def test_every_timestamp_comes_back_timezone_aware_utc(store: JobStore) -> None:
    await store.register_instance(instance(OWNER), TTL_S)
    await store.mark_instance_stopped(OWNER)
    job = await running(store, new_job())
    await store.request_cancel(job.id)
    queued = await store.insert_job(new_job(), TTL_S)
    assert await store.complete(job.id, OWNER, done())
    row = await get(store, job.id)
    for moment in (
        row.created_at, row.started_at, row.finished_at, row.updated_at,
        row.cancel_requested_at, queued.lease_deadline,
    ):
        epoch(moment)
    (inst,) = await store.list_instances()
    for moment in (inst.started_at, inst.heartbeat_at, inst.lease_expires_at, inst.stopped_at):
        epoch(moment)



async def test_read_output_past_any_integer_column_is_an_empty_page(store: JobStore) -> None:
    # An offset or length of 2**62 (a caller's bad page) must not overflow a 32-bit SQL
    # argument (PostgreSQL's substring) or allocate: past the end is just an empty page.
    job = await running(store, new_job())
    assert await store.complete(job.id, OWNER, done(output="short", output_bytes=5))
    for offset, length in ((2**62, 10), (0, 2**62), (2**62, 2**62), (2**31, 2**31)):
        data, total = await store.read_output(job.id, offset, length) or (None, None)
        assert total == 5
        assert data == (b"short" if offset == 0 else b"")
