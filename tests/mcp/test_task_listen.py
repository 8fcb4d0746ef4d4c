"""`notifications/tasks` over `subscriptions/listen` (the tasks extension's push), spoken as
raw JSON-RPC over a real stdio gateway: no client library sends `taskIds` yet (the SDK's
`Client.listen` and FastMCP's tasks client poll `tasks/get`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.mcp.conftest import Harness, own_harness
from tests.mcp.task_client import RawStdioClient, raw_stdio
from tests.mcp.test_tasks import envelope
from tests.mcp.test_tools import tag
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TEST_TIMEOUT_S = 60.0
EXT = "io.modelcontextprotocol/tasks"
SUBSCRIPTION_KEY = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture
def stdio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with own_harness("stdio-auto", tmp_path, monkeypatch) as harness:
        yield harness


async def create_task(client: RawStdioClient, prompt: str) -> str:
    """A task, once the gateway's store is open (before that the call is answered
    `unavailable`, retryable: a loaded box opens it later than the first request)."""
    while True:
        created = await client.result("tools/call", {"name": "codex_request",
                                                     "arguments": {"prompt": prompt},
                                                     "_meta": envelope(EXT)})
        if not created.get("content", [{}])[0].get("retryable"):
            break
        await anyio.sleep(0.1)
    assert created["resultType"] == "task", created
    return str(created["taskId"])


async def listen(client: RawStdioClient, notifications: dict[str, Any],
                 *extensions: str) -> int:
    return await client.start("subscriptions/listen", {"notifications": notifications,
                                                       "_meta": envelope(*extensions)})


async def test_a_listener_hears_its_task_now_and_when_it_ends(stdio: Harness,
                                                              tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    prompt = f"listen {tag()} @until={gate}"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(stdio) as client:
            task_id = await create_task(client, prompt)
            listen_id = await listen(client, {"taskIds": [task_id, "no-such-task"]}, EXT)
            ack = await client.notification("notifications/subscriptions/acknowledged")
            # Only the task this caller could `tasks/get` is honoured.
            assert ack["params"]["notifications"] == {"taskIds": [task_id]}
            assert ack["params"]["_meta"] == {SUBSCRIPTION_KEY: listen_id}
            now = (await client.notification("notifications/tasks"))["params"]
            assert (now["taskId"], now["status"]) == (task_id, "working")
            assert "result" not in now
            gate.touch()
            ended = (await client.notification("notifications/tasks"))["params"]
            assert (ended["taskId"], ended["status"]) == (task_id, "completed")
            assert ended["_meta"] == {SUBSCRIPTION_KEY: listen_id}
            assert ended["result"]["content"][0]["text"].strip() == f"fake-codex answer: {prompt}"
            # Exactly what tasks/get answers at that moment.
            got = await client.result("tasks/get", {"taskId": task_id, "_meta": envelope(EXT)})
            def task(answer: dict[str, Any]) -> dict[str, Any]:
                return {k: v for k, v in answer.items() if k not in ("resultType", "_meta")}

            assert task(got) == task(ended)


async def test_a_task_that_ended_before_the_listen_is_told_at_once_and_only_once(
        stdio: Harness, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(stdio) as client:
            task_id = await create_task(client, f"quick {tag()}")
            while (await client.result("tasks/get", {"taskId": task_id,
                                                     "_meta": envelope(EXT)}))["status"] \
                    == "working":
                await anyio.sleep(0.05)
            held = await create_task(client, f"held {tag()} @until={gate}")
            await listen(client, {"taskIds": [task_id, held], "toolsListChanged": True}, EXT)
            ack = await client.notification("notifications/subscriptions/acknowledged")
            assert ack["params"]["notifications"] == {"taskIds": [task_id, held],
                                                      "toolsListChanged": True}
            # The held task ends only when the gate opens, after both were first told: a
            # second word of the ended task would come before its end.
            told: list[tuple[str, str]] = []
            while told.count((held, "working")) + told.count((task_id, "completed")) < 2:
                params = (await client.notification("notifications/tasks"))["params"]
                told.append((params["taskId"], params["status"]))
            gate.touch()
            while (held, "completed") not in told:
                params = (await client.notification("notifications/tasks"))["params"]
                told.append((params["taskId"], params["status"]))
            assert [status for tid, status in told if tid == task_id] == ["completed"], told


async def test_task_ids_without_the_extension_are_refused_with_32021(stdio: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(stdio) as client:
            task_id = await create_task(client, f"plain {tag()}")
            refused = await client.answer(await listen(client, {"taskIds": [task_id]}))
            assert refused["error"]["code"] == -32021
            assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {EXT: {}}}}


@pytest.mark.parametrize("task_ids", ["one-id", [1, 2], ["t"] * 101],
                         ids=["not-a-list", "not-strings", "too-many"])
async def test_malformed_task_ids_get_a_clear_invalid_params(stdio: Harness,
                                                             task_ids: Any) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(stdio) as client:
            refused = await client.answer(await listen(client, {"taskIds": task_ids}, EXT))
            assert refused["error"]["code"] == -32602
            assert "taskIds" in refused["error"]["message"]


async def test_a_listen_without_task_ids_is_still_the_sdks(stdio: Harness) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with raw_stdio(stdio) as client:
            await listen(client, {"toolsListChanged": True, "taskIds": None})
            ack = await client.notification("notifications/subscriptions/acknowledged")
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
