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

from functools import partial

import anyio
import pytest
from mcp import Client

from gateway.model import JobStatus
from gateway.store.base import SCHEMA_VERSION
from tests.upgrade.fleet import POLL_S, SETTLE_S, Fleet
from tests.waiting import scaled

pytestmark = pytest.mark.anyio


async def test_the_previous_release_and_this_one_share_a_store_through_an_upgrade(
    fleet: Fleet,
) -> None:
    # A and B are held by the fake CLI until the test lets them go (@until=): A runs while
    # the new gateway starts and migrates, B is still running when the old window closes,
    # however slowly a loaded box starts gateways (a fixed @sleep raced the start).
    go_a, go_b = fleet.root / "go-a", fleet.root / "go-b"
    prompts = {"a": f"@until={go_a} served-by-old-while-new-migrates",
               "b": f"@until={go_b} detached-by-old-adopted-by-new",
               "c": "queued-on-old-run-on-new"}
    close_old, old_closed = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as windows:
        old: Client = await windows.start(partial(fleet.window, close_old, old=True,
                                                  closed=old_closed))
        a = await fleet.submit(old, prompts["a"])
        await fleet.until_started(prompts["a"])
        async with fleet.gateway(old=False) as new:
            # The new gateway migrated the store under the old one, which keeps serving.
            assert await fleet.status(new, a) == "running"
            assert await fleet.schema_version() == SCHEMA_VERSION
            go_a.touch()
            assert await fleet.until(old, a, "completed") == "completed"
            assert await fleet.status(new, a) == "completed"

            b = await fleet.submit(old, prompts["b"])
            await fleet.until_started(prompts["b"])
            c = await fleet.submit(old, prompts["c"])
            assert await fleet.status(old, c) == "queued"  # one run at a time
            close_old.set()  # the old window closes: B detached, C left queued
            await old_closed.wait()
            go_b.touch()  # B ends only now, under its adopter

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
        with anyio.fail_after(scaled(SETTLE_S)):
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
