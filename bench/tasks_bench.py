"""The MCP Tasks rows of bench/run.py: what a task-capable client pays per poll.

Measured on the 2026-07-28 wire (the SDK client's `auto` mode), against the no-op round
trip of the minimal server on the same wire, interleaved:
- `tasks/get` of a completed task (the task is a finished job; its result is the sync
  answer, read from the store each time);
- `llm_job_result` of the same finished small answer (the page a polling client reads);
- the opt-in check on a plain `tools/call`: `llm_job_status` from a client that advertises
  the tasks extension over the same call from one that does not (the interceptor runs for
  both; only the first reaches the capability lookup).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import mcp_types
from mcp import Client
from mcp.client.extension import advertise
from mcp_types import RequestParams, Result
from pydantic import ConfigDict, Field

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASKS_MODE = "auto"  # the tasks extension exists on the 2026-07-28 wire only


class _TaskIdParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True)

    task_id: str = Field(serialization_alias="taskId")


class _GetTask(mcp_types.Request[_TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskIdParams


class _AnyResult(Result):
    model_config = ConfigDict(extra="allow")


def extensions() -> list[Any]:
    """The client side of the opt-in: the identifier advertised on every request."""
    return [advertise(TASKS_EXTENSION)]


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    result = await client.session.send_request(_GetTask(params=_TaskIdParams(task_id=task_id)),
                                               _AnyResult)
    return result.model_dump(by_alias=True, exclude_none=True)


async def roundtrips(opted: Client, plain: Client, minimal: Client, job_id: str,
                     calls: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved samples: no-op, tasks/get, llm_job_result, llm_job_status with and
    without the opt-in."""
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("noop", "tasks_get", "job_result", "status_opted",
                                        "status_plain")}
    steps = (
        ("noop", lambda: minimal.call_tool("noop", {})),
        ("tasks_get", lambda: get_task(opted, job_id)),
        ("job_result", lambda: plain.call_tool("llm_job_result", {"job_id": job_id})),
        ("status_opted", lambda: opted.call_tool("llm_job_status", {"job_id": job_id})),
        ("status_plain", lambda: plain.call_tool("llm_job_status", {"job_id": job_id})),
    )
    for i in range(warmup + calls):
        for key, step in steps:
            started = time.perf_counter()
            answer = await step()
            elapsed = time.perf_counter() - started
            if isinstance(answer, dict):
                if answer.get("status") != "completed" or "result" not in answer:
                    raise RuntimeError(f"tasks/get did not answer the finished task: {answer}")
            elif answer.is_error:
                raise RuntimeError(f"{key} failed: {answer.content}")
            if i >= warmup:
                samples[key].append(elapsed)
    return samples
