"""The first tools/list of a start answered from the last start's listing (issue 45).

Real gateways over stdio, started one after the other on one config and HOME, as a client
restarts its MCP server. What must hold: a restart lists exactly what the tools derive to;
a tool called right after that listing (before the tools are derived in the background)
works; and a change of what the listing depends on (here the configuration) or a damaged
file never lists anything stale.
"""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest
import tomli_w
from mcp import Client

from gateway.mcp.listing_cache import CACHE_NAME
from tests.mcp.conftest import stdio_client
from tests.mcp.test_listing import Machine, listed
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
PLANTED = "planted by the test: served only from the cache"


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def cache_file(machine: Machine, config: Path) -> Path:
    return machine.harness.db_of(config).parent / CACHE_NAME


async def listing(machine: Machine, config: Path) -> dict[str, dict[str, Any]]:
    async with stdio_client(machine.root / "home", config, "legacy") as client:
        return {name: tool.model_dump() for name, tool in (await listed(client)).items()}


def plant_description(path: Path, tool: str) -> None:
    """Rewrite one cached tool's description, keeping the file's key."""
    data = json.loads(path.read_bytes())
    for entry in data["tools"]:
        if entry["name"] == tool:
            entry["description"] = PLANTED
    path.write_text(json.dumps(data))


async def status_of(client: Client) -> dict[str, Any]:
    result = await client.call_tool("gateway_status", {})
    assert not result.is_error, result.content
    return dict(result.structured_content or {})


async def first_start(machine: Machine) -> tuple[Path, dict[str, dict[str, Any]], Path]:
    """Claude installed, one config: the first start's listing (derived, then kept) and the
    file it was kept in."""
    machine.install("claude")
    config = machine.config()
    derived = await listing(machine, config)
    return config, derived, cache_file(machine, config)


async def test_a_restart_lists_exactly_what_the_tools_derive_to_and_calls_work_at_once(
        machine: Machine) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        config, derived, path = await first_start(machine)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert await listing(machine, config) == derived  # answered from the file

        plant_description(path, "claude_request")
        async with stdio_client(machine.root / "home", config, "legacy") as client:
            tools = await listed(client)
            # The restart answered from the file (so the planted text)...
            assert tools["claude_request"].description == PLANTED
            # ...and a call at once, before the background derivation, runs on real tools.
            assert (await status_of(client))["listed_providers"] == ["claude"]
            answer = await client.call_tool("claude_request", {"prompt": "hello"})
            assert not answer.is_error, answer.content


async def test_a_changed_configuration_or_a_damaged_file_lists_freshly_derived_tools(
        machine: Machine) -> None:
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        config, derived, path = await first_start(machine)
        plant_description(path, "claude_request")
        # The same store and state dir, another sync_defer_after_s: another key.
        changed = config.with_name("changed.toml")
        data = tomllib.loads(config.read_text())
        data.setdefault("limits", {})["sync_defer_after_s"] = 7
        changed.write_bytes(tomli_w.dumps(data).encode())
        tools = await listing(machine, changed)
        assert "after 7 s" in tools["claude_request"]["description"]
        assert tools["claude_request"]["description"] != PLANTED

        path.write_bytes(b"\x00 not json")
        assert await listing(machine, config) == derived
        assert json.loads(path.read_bytes())["tools"]  # written again, whole
