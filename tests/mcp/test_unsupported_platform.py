"""A system without the POSIX process model (native Windows) is refused with guidance, not
with a dead server (issue 21): `serve` completes the MCP handshake and every tool answers
`setup_error` naming the WSL route with the exact Claude Desktop snippet.

The verdict is forced (AGENT_GATEWAY_PLATFORM=unsupported); the second test also takes away,
before the gateway is imported, what native Windows lacks (os.setsid, os.killpg, fcntl, the
POSIX-only signals), so a module that used one of them at import would fail the handshake.
Real stdio MCP sessions, as Claude Desktop starts the gateway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from gateway import platform
from tests.mcp.conftest import CLIENT_TIMEOUT_S, server_env
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 60.0
EVERY_KIND_OF_TOOL: list[tuple[str, dict[str, Any]]] = [
    ("claude_request", {"prompt": "p"}), ("codex_request_async", {"prompt": "p"}),
    ("llm_job_list", {}), ("llm_job_status", {"job_id": "x"}), ("list_models", {}),
]
# What native Windows has not, taken away before the gateway's first import: the POSIX-only
# functions and signals, and (for the gateway's and the providers' own imports: the SDK and
# the stdlib choose by sys.platform, which stays "linux" here) the POSIX-only modules.
NO_POSIX = """
import builtins, os, signal, sys
for name in ("setsid", "killpg", "getpgid", "getpgrp", "setpgid", "fork", "pipe2"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("SIGKILL", "SIGHUP", "SIGPIPE", "SIGCHLD", "SIGSTOP", "SIGCONT", "SIGQUIT",
             "SIGUSR1", "SIGUSR2", "SIGALRM"):
    if hasattr(signal, name):
        delattr(signal, name)
POSIX_ONLY = {"fcntl", "termios", "resource", "pwd", "grp", "pty", "tty", "posix"}
real_import = builtins.__import__
def windows_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__") or ""
    if name.split(".")[0] in POSIX_ONLY and importer.split(".")[0] in ("gateway", "providers"):
        raise ImportError(f"{importer} imports {name}, which native Windows lacks")
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = windows_import
sys.argv = ["agent-cli-gateway"]
import runpy
runpy.run_module("gateway", run_name="__main__")
"""


def params(tmp_path: Path, code: str | None) -> StdioServerParameters:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = server_env(home, tmp_path / "absent.toml", AGENT_GATEWAY_PLATFORM="unsupported")
    args = ["-m", "gateway"] if code is None else ["-c", code]
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(home))


def assert_names_the_wsl_route(text: str) -> None:
    assert '"command": "wsl.exe"' in text, text
    assert '"args": ["uv", "run", "--directory", "/home/you/agent-cli-gateway", ' \
        '"agent-cli-gateway"]' in text, text  # the checkout form: it works before a release
    assert "WSL" in text and "will not pass by itself" in text, text


@pytest.mark.parametrize("posix", ["as_is", "taken_away"])
async def test_a_system_without_posix_processes_answers_every_tool_with_the_wsl_route(
        tmp_path: Path, posix: str) -> None:
    code = None if posix == "as_is" else NO_POSIX
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)):
        async with Client(params(tmp_path, code), mode="legacy",
                          read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            answers = [(name, await client.call_tool(name, arguments))
                       for name, arguments in EVERY_KIND_OF_TOOL if name in tools]
            status = await client.call_tool("gateway_status", {})
    assert {"gateway_status", "llm_job_list"} <= tools
    assert len(answers) >= 3, tools
    for name, answer in answers:
        data = answer.structured_content
        assert answer.is_error and data is not None, (name, answer.content)
        assert data["error_kind"] == "setup_error", (name, data)
        assert_names_the_wsl_route(data["error"])
    shown = status.structured_content
    assert shown is not None and shown["ready"] is False
    assert shown["platform"]["implementation"] == platform.UNSUPPORTED
    assert_names_the_wsl_route(shown["problem"])


def test_the_wsl_snippet_is_valid_claude_desktop_json() -> None:
    config = json.loads(platform.WSL_SNIPPET)
    server = config["mcpServers"]["agent-cli-gateway"]
    assert server["command"] == "wsl.exe"
    assert server["args"][:3] == ["uv", "run", "--directory"]
    assert server["args"][-1] == "agent-cli-gateway"


def test_the_readme_shows_the_same_wsl_snippet() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert platform.WSL_SNIPPET in readme
