"""llm_job_wait over several jobs (issue 40): `mode="any"` answers at the first end, `"all"`
at the last, over every transport with a real MCP client; the single-job form is unchanged."""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest

from tests.mcp.conftest import Harness, first_text
from tests.mcp.test_tools import succeed

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 90.0


async def test_any_answers_at_the_first_end_and_all_at_the_last(gateway: Harness,
                                                                 tmp_path: Path) -> None:
    gates = [tmp_path / f"gate-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with gateway.connect() as client:
            ids = []
            for gate in gates:
                started = await succeed(client, "claude_request_async",
                                        {"prompt": f"wait for {gate.name} @until={gate}"})
                ids.append(started["job_id"])

            idle = await succeed(client, "llm_job_wait",
                                 {"job_ids": ids, "mode": "any", "timeout_s": 0.3})
            assert idle["done"] is False and idle["ended"] == []
            assert sorted(idle["waiting"]) == sorted(ids)
            assert idle["next"]["arguments"]["job_ids"]

            gates[1].touch()
            first = await succeed(client, "llm_job_wait",
                                  {"job_ids": ids, "mode": "any", "timeout_s": 40})
            assert first["done"] is True and first["ended"] == [ids[1]]
            by_id = {job["job_id"]: job for job in first["jobs"]}
            assert by_id[ids[1]]["status"] == "completed"
            assert {by_id[ids[0]]["status"], by_id[ids[2]]["status"]} <= {"queued", "running"}

            not_all = await succeed(client, "llm_job_wait",
                                    {"job_ids": ids, "mode": "all", "timeout_s": 0.3})
            assert not_all["done"] is False and not_all["ended"] == [ids[1]]

            gates[0].touch()
            gates[2].touch()
            every = await succeed(client, "llm_job_wait",
                                  {"job_ids": ids, "mode": "all", "timeout_s": 40})
            assert every["done"] is True and sorted(every["ended"]) == sorted(ids)
            assert every["next"] is None and every["waiting"] == []

            one = await succeed(client, "llm_job_wait", {"job_id": ids[0], "timeout_s": 5})
            assert one["done"] is True and one["job_id"] == ids[0]


async def test_job_id_and_job_ids_together_or_neither_is_a_clear_error(
        gateway: Harness) -> None:
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with gateway.connect() as client:
            for args in ({}, {"job_id": "a", "job_ids": ["b"]}):
                result = await client.call_tool("llm_job_wait", args)
                assert result.is_error
                assert "job_ids" in first_text(result)
            unknown = await client.call_tool("llm_job_wait",
                                             {"job_ids": [str(uuid.uuid4())]})
            assert unknown.is_error and "No job" in first_text(unknown)
