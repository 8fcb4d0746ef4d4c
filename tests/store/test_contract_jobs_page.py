"""The dashboard's page of the jobs table (`list_jobs_page`) on every backend: newest first,
filters before the limit, a keyset cursor that goes on from the previous page's last row,
and light rows."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gateway.model import JobStatus
from gateway.store.base import JobsPage, JobStore
from tests.store.contract_helpers import OWNER, TTL_S, done, new_job, running

pytestmark = pytest.mark.anyio


async def test_pages_go_newest_first_and_a_cursor_continues_without_gap_or_repeat(
        store: JobStore) -> None:
    ids = []
    for _ in range(7):
        job = new_job()
        await store.insert_job(job, TTL_S)
        ids.append(job.id)
    first = await store.list_jobs_page(JobsPage(limit=3))
    second = await store.list_jobs_page(JobsPage(limit=3, after_id=first[-1].id))
    third = await store.list_jobs_page(JobsPage(limit=3, after_id=second[-1].id))
    seen = [row.id for row in first + second + third]
    assert len(seen) == 7 and set(seen) == set(ids)
    everything = [row.id for row in await store.list_jobs(limit=10)]
    assert seen == everything  # the same order as list_jobs: created_at, then id, descending
    assert len(third) == 1


async def test_a_page_filters_status_provider_and_host_before_its_limit(store: JobStore) -> None:
    wanted = dataclasses.replace(new_job(provider="codex"), hostname="host-2")
    finished = await running(store, wanted)
    assert await store.complete(finished.id, OWNER, done())
    for _ in range(4):  # newer rows that every filter leaves out
        await store.insert_job(dataclasses.replace(new_job(provider="codex"),
                                                   hostname="host-2"), TTL_S)
        await store.insert_job(new_job(provider="claude"), TTL_S)
    page = await store.list_jobs_page(JobsPage(statuses=(JobStatus.COMPLETED,),
                                               provider="codex", hostname="host-2", limit=1))
    assert [row.id for row in page] == [wanted.id]
    assert len(await store.list_jobs_page(JobsPage(hostname="host-2", limit=50))) == 5
    assert len(await store.list_jobs_page(JobsPage(provider="claude", limit=50))) == 4
    assert await store.list_jobs_page(JobsPage(hostname="nowhere")) == []


async def test_a_page_holds_light_rows(store: JobStore) -> None:
    job = await running(store, new_job())
    completion = done(output="x" * 1000,
                      result_json=json.dumps({"text": "the answer", "usage": {"cost_usd": 1}}))
    assert await store.complete(job.id, OWNER, completion)
    (row,) = await store.list_jobs_page(JobsPage())
    assert row.output is None
    assert row.result_json is not None and "text" not in json.loads(row.result_json)
    assert json.loads(row.result_json)["usage"] == {"cost_usd": 1}


async def test_a_cursor_whose_job_is_gone_gives_an_empty_page(store: JobStore) -> None:
    await store.insert_job(new_job(), TTL_S)
    assert await store.list_jobs_page(JobsPage(after_id="no-such-job")) == []
