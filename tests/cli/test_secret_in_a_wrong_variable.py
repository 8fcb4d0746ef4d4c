"""#38 item 8: a secret typed into the wrong scalar variable is never printed anywhere.

`AGENT_GATEWAY_HTTP__PORT=sk-...` (a token pasted into the line above the right one) was
quoted by `doctor`, and over stdio three times: on stderr, in the log record, in every
tool's `setup_error`. Each surface runs for real here: the console entry as a subprocess
(`doctor`, `config show`, `serve --transport http`) and `serve` over stdio through the
SDK's stdio client, with every message the server wrote on stdout recorded. The error
must name the variable and what the key expects, and hold no part of the value.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage

from tests.cli.cli_support import CLI_TIMEOUT_S, hermetic_env
from tests.mcp.conftest import CLIENT_TIMEOUT_S, server_env
from tests.waiting import scaled

TEST_TIMEOUT_S = 60.0  # a cold `python -m gateway` on a loaded 2-core box, and two calls


@dataclass(frozen=True)
class Misplaced:
    """A secret in a variable whose key takes a number: what must never appear (the
    value, and the part of it that is the secret) and what the error must say instead."""

    name: str
    value: str
    secret: str
    expects: str

    @property
    def key(self) -> str:
        return ".".join(self.name.removeprefix("AGENT_GATEWAY_").lower().split("__"))

    def id(self) -> str:
        return self.key


CASES = [
    Misplaced("AGENT_GATEWAY_HTTP__PORT", "sk-live-4f9aQz7Tport", "4f9aQz7Tport",
              "valid integer"),
    Misplaced("AGENT_GATEWAY_BUDGETS__DAILY_USD", "sk-live-8c1dWb3Xusd", "8c1dWb3Xusd",
              "valid number"),
    Misplaced("AGENT_GATEWAY_PERSISTENCE__RETENTION_DAYS",
              "postgresql://u:PW-hunter2-days@h/db", "hunter2", "valid number"),
]
pytestmark = pytest.mark.parametrize("case", CASES, ids=Misplaced.id)


def assert_never_shown(case: Misplaced, *outputs: str) -> None:
    for output in outputs:
        assert case.secret not in output, output
        assert case.value not in output, output


def assert_named(case: Misplaced, text: str) -> None:
    """The problem line names the key, the variable and what the key expects."""
    lines = [line for line in text.splitlines() if case.name in line and case.key in line]
    assert lines, text
    assert any(case.expects in line for line in lines), text


def run_cli(home: Path, case: Misplaced, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args],
                          env=hermetic_env(home, {case.name: case.value}), cwd=home,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)


@pytest.mark.parametrize("args", [("doctor",), ("doctor", "--json"), ("config", "show"),
                                  ("config", "show", "--json")], ids=" ".join)
def test_a_command_names_the_variable_and_never_its_value(
        home: Path, case: Misplaced, args: tuple[str, ...]) -> None:
    done = run_cli(home, case, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert_never_shown(case, done.stdout, done.stderr)
    assert_named(case, done.stdout + done.stderr)


def test_serve_over_http_refuses_naming_the_variable_and_never_its_value(
        home: Path, case: Misplaced) -> None:
    done = run_cli(home, case, "serve", "--transport", "http", "--no-auth")
    assert done.returncode == 2, done.stderr
    assert_never_shown(case, done.stdout, done.stderr)
    assert_named(case, done.stderr)
    assert "Traceback" not in done.stderr


@contextlib.asynccontextmanager
async def recorded_stdio(params: StdioServerParameters, errlog: Any,
                         wire: list[str]) -> AsyncIterator[Any]:
    """The SDK's stdio transport, with every message the server writes on stdout copied
    into `wire` on its way to the client."""
    async with stdio_client(params, errlog=errlog) as (read, write):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](64)

        async def tee() -> None:
            async with send:
                async for item in read:
                    wire.append(item.message.model_dump_json() if isinstance(
                        item, SessionMessage) else repr(item))
                    await send.send(item)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(tee)
            yield receive, write
            tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_serve_over_stdio_answers_setup_error_naming_the_variable_never_its_value(
        home: Path, tmp_path: Path, case: Misplaced) -> None:
    """What an MCP client starts: it serves anyway, and the stderr line, the log record,
    the instructions and every tool's `setup_error` name the variable, never the value."""
    env = server_env(home, home / "config.toml", **{case.name: case.value})
    del env["AGENT_GATEWAY_CONFIG"]  # no file: the defaults and the variable
    params = StdioServerParameters(command=sys.executable, args=["-m", "gateway"],
                                   cwd=str(home), env=env)
    wire: list[str] = []
    stderr_path = tmp_path / "stderr.log"
    with anyio.fail_after(scaled(TEST_TIMEOUT_S)), stderr_path.open("w") as errlog:
        async with Client(recorded_stdio(params, errlog, wire), mode="legacy",
                          read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            instructions = client.instructions or ""
            answer = await client.call_tool("llm_job_list", {})
            status = await client.call_tool("gateway_status", {})
    assert answer.is_error and isinstance(answer.structured_content, dict)
    error = answer.structured_content["error"]
    assert answer.structured_content["error_kind"] == "setup_error"
    stderr = stderr_path.read_text(errors="replace")
    assert_never_shown(case, "\n".join(wire), stderr)
    for text in (error, instructions, stderr):
        assert_named(case, text)
    assert isinstance(status.structured_content, dict)
    assert case.name in status.structured_content["problem"]
