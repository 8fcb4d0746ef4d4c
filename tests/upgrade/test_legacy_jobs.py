"""#38 item 6: what a client sees of the jobs the previous release made, after an upgrade.

0.1.0 recorded no principal, and a 0.1.0 gateway still serving a migrated store keeps writing
rows without one: such a job is *legacy* (gateway/mcp/principal.py). Real processes only:
0.1.0 makes two jobs over stdio (one before this release migrates the store, one after,
while both serve it); then this release, over Streamable HTTP with a bearer token, answers
each `llm_job_*` call and `tasks/get` on them with `legacy_job` and a message that says where
to read them, and lists only the token's own job; over stdio it serves them with their
answers; the operator CLI shows them. Nothing rewrites their rows.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway.config import load_settings
from gateway.store import open_store
from tests.mcp.conftest import first_text, free_port, server_env, start_http_server
from tests.mcp.test_principals import session
from tests.upgrade.fleet import SETTLE_S, Fleet
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TOKEN = "token-of-an-upgraded-client-" + "u" * 16
CLI_TIMEOUT_S = scaled(60.0)


def job_calls(job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Every tool that takes a job id, as a client would call it."""
    return [("llm_job_status", {"job_id": job_id}), ("llm_job_result", {"job_id": job_id}),
            ("llm_job_wait", {"job_id": job_id, "timeout_s": 0}),
            ("llm_job_cancel", {"job_id": job_id}), ("llm_job_changes", {"job_id": job_id})]


def operator_cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """`agent-cli-gateway <args>` of this checkout on the fleet's store."""
    return subprocess.run([sys.executable, "-m", "gateway", *args],
                          env=server_env(fleet.home, fleet.config), cwd=fleet.home,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)


async def principals(fleet: Fleet, job_ids: list[str]) -> dict[str, tuple[str | None, bool]]:
    """Each job's principal and whether a cancel was ever requested, as the store holds them."""
    store = await open_store(load_settings(fleet.config))
    try:
        found = {}
        for job_id in job_ids:
            row = await store.get_job(job_id, with_output=False)
            assert row is not None, job_id
            found[job_id] = (row.principal, row.cancel_requested_at is not None)
        return found
    finally:
        await store.close()


async def test_a_job_of_the_previous_release_is_legacy_to_a_token_and_served_over_stdio(
    fleet: Fleet,
) -> None:
    prompts = ["made-by-0.1.0-before-the-upgrade", "made-by-0.1.0-beside-the-new-release"]
    close_old = anyio.Event()
    async with anyio.create_task_group() as windows:
        old: Client = await windows.start(partial(fleet.window, close_old, old=True))
        legacy = [await fleet.submit(old, prompts[0])]
        await fleet.until(old, legacy[0], "completed")
        # This release starts over HTTP (migrating the store); 0.1.0 keeps serving it.
        server = await anyio.to_thread.run_sync(partial(
            start_http_server, fleet.home, fleet.config, free_port(), token=TOKEN))
        try:
            legacy.append(await fleet.submit(old, prompts[1]))
            await fleet.until(old, legacy[1], "completed")
            close_old.set()
            with anyio.fail_after(scaled(SETTLE_S)):
                async with session(server.url, TOKEN) as http:
                    made = await http.tool("claude_request_async", {"prompt": "made-over-http"})
                    own = made["structuredContent"]["job_id"]
                    for job_id in legacy:
                        for name, args in job_calls(job_id):
                            answer = await http.tool(name, args)
                            data = answer["structuredContent"]
                            assert answer.get("isError"), (name, answer)
                            assert data["error_kind"] == "legacy_job", (name, data)
                            assert data["retryable"] is False
                            assert "0.1.0" in data["error"] and "stdio" in data["error"]
                            assert f"agent-cli-gateway jobs show {job_id}" in data["error"]
                        refused = await http.request("tasks/get", {"taskId": job_id})
                        assert "0.1.0" in refused["error"]["message"], refused
                    listed = (await http.tool("llm_job_list", {}))["structuredContent"]
                    assert [j["job_id"] for j in listed["jobs"]] == [own]
        finally:
            server.stop()

    # Over stdio (the principal `local`) they are served as ever, with their answers.
    with anyio.fail_after(scaled(SETTLE_S)):
        async with fleet.gateway(old=False) as stdio:
            for job_id, prompt in zip(legacy, prompts, strict=True):
                assert await fleet.status(stdio, job_id) == "completed"
                result = await stdio.call_tool("llm_job_result", {"job_id": job_id})
                assert not result.is_error, result
                assert f"fake-claude answer: {prompt}" in first_text(result)
            listed = await stdio.call_tool("llm_job_list", {})
            assert listed.structured_content is not None
            assert set(legacy) <= {j["job_id"] for j in listed.structured_content["jobs"]}

    # The operator CLI, as the message tells: it reads the store directly.
    for job_id in legacy:
        shown = await anyio.to_thread.run_sync(operator_cli, fleet, "jobs", "show", job_id)
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert job_id in shown.stdout and "completed" in shown.stdout

    # Still legacy in the store, and the token's cancels wrote nothing.
    assert await principals(fleet, legacy) == {job_id: (None, False) for job_id in legacy}
