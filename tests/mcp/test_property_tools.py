"""Property: whatever arguments a client sends, inside or outside a tool's input schema, the
gateway answers with a result or a clear error: never `internal_error`, never a traceback,
and the store holds nothing non-terminal or half-written afterwards.

One real MCP session (the SDK's in-process client over memory streams) on a real SQLite
file, the fake provider CLIs and a fake OpenAI-compatible API on loopback; hypothesis draws
the tool and its arguments from the schemas the server itself lists.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mcp import Client, MCPError
from mcp.types import INTERNAL_ERROR, Tool

from gateway.config import load_settings
from gateway.mcp.server import build_server
from tests.fakes.fake_api_server import run_fake_api_server
from tests.mcp.conftest import Harness, server_env
from tests.waiting import scaled

MAX_EXAMPLES = 120  # about 20 s on an idle 2-core box; each CLI call spawns a fake
STRICT_EXAMPLES = 80  # refused before any job: cheap
CALL_TIMEOUT_S = 30.0  # sync requests defer after 1 s; nothing may take near this
SETTLE_TIMEOUT_S = 30.0  # every admitted job is terminal within this once calls stop
TERMINAL = {"completed", "failed", "cancelled", "timed_out", "orphaned"}
# Strings that have broken gateways: flags, padding, NUL, lone surrogates, huge paths.
NASTY_STRINGS = ["", " ", "--yolo", "  --yolo", "\t-x", "\x00", "a\x00b", "\ud800", "x\udfff",
                 "/" + "a" * 5000, "/", "~", "~nosuchuser/x", "../..", "relative/dir",
                 "default", "latest", "é" * 300, "\u200b--help"]
NASTY_NUMBERS = [0, -1, 2**62, 2**70, -(2**63), 1e308, float("inf"), float("-inf"),
                 float("nan"), 1e-300, 0.5]


def strings() -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=30), st.sampled_from(NASTY_STRINGS),
                     st.text(st.characters(exclude_categories=[]), max_size=8))


json_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(NASTY_NUMBERS),
              st.floats(), strings()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings(), inner, max_size=3),
    max_leaves=6)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for one property's JSON schema (the subset pydantic emits)."""
    if "anyOf" in schema:
        return st.one_of([from_schema(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return st.text(min_size=1, max_size=40) | st.sampled_from(NASTY_STRINGS)
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"),
                         allow_nan=False, allow_infinity="maximum" not in schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=3)
    if kind == "object" and "properties" in schema:
        return arguments_inside(schema)
    return json_values


def arguments_inside(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """The required properties and any subset of the optional ones, each schema-valid."""
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {name: from_schema(properties[name]) for name in required},
        optional={name: from_schema(p) for name, p in properties.items()
                  if name not in required})


def arguments_outside(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Anything at all under the tool's own property names (or unknown ones)."""
    names = list(schema.get("properties", {})) or ["x"]
    return st.dictionaries(st.sampled_from(names) | strings(), json_values, max_size=4)


@dataclass
class Session:
    client: Client
    tools: dict[str, Tool]
    db: Path
    portal: BlockingPortal | None = None
    job_ids: set[str] = field(default_factory=set)


@contextlib.asynccontextmanager
async def open_session(harness: Harness) -> AsyncIterator[Session]:
    async with run_fake_api_server() as api:
        config = harness.write_config({
            "limits": {"sync_defer_after_s": 1, "max_prompt_bytes": 4096,
                       "default_timeout_s": 20},
            "api_providers": {"router": {"kind": "openai", "base_url": api.base_url + "/v1",
                                         "default_model": "m-1", "timeout_s": 10}}})
        harness.monkeypatch.setenv("HOME", str(harness.home))
        harness.monkeypatch.setenv("PATH", server_env(harness.home, config)["PATH"])
        server = build_server(load_settings(config))
        async with Client(server, read_timeout_seconds=CALL_TIMEOUT_S) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            state = Session(client, tools, Harness.db_of(config))
            yield state
            with anyio.fail_after(scaled(SETTLE_TIMEOUT_S)):
                while unfinished(state.db):
                    await anyio.sleep(0.1)


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capfd: pytest.CaptureFixture[str]) -> Iterator[Session]:
    """One session for all the examples, in an event loop of its own (hypothesis drives
    the examples synchronously; each call is handed to that loop)."""
    (tmp_path / "home").mkdir()
    harness = Harness("inproc", tmp_path, monkeypatch)
    with start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(open_session(harness)) as state:
        state.portal = portal
        yield state
    check_store(state)
    logged = capfd.readouterr()
    for text in (logged.out, logged.err):
        for marker in ("Traceback", "tool crashed"):
            at = text.find(marker)
            assert at < 0, text[max(0, at - 2000):at + 6000]


def read_jobs(db: Path, sql: str) -> list[sqlite3.Row]:
    """The store's rows, or none when no call ever opened it: the store is created on first
    use, and a run of refused calls may never get that far. Read-only, so this look never
    creates the file (or a table) ahead of the gateway."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        has_jobs = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
        return conn.execute(sql).fetchall() if has_jobs else []


def unfinished(db: Path) -> list[str]:
    return [r["id"] for r in read_jobs(db, (
        "SELECT id FROM jobs WHERE status NOT IN "
        "('completed','failed','cancelled','timed_out','orphaned')"))]


def check_store(state: Session) -> None:
    """Every row is terminal and whole, and belongs to a job some caller was told about."""
    rows = read_jobs(state.db, "SELECT * FROM jobs")
    for row in rows:
        assert row["status"] in TERMINAL, dict(row)
        assert row["finished_at"] is not None, dict(row)
        assert row["error_kind"] != "internal_error", dict(row)
        if row["status"] != "completed":
            assert row["error_kind"] and row["error"], dict(row)
        json.loads(row["request_json"])
        assert row["id"] in state.job_ids, f"a row no answer mentioned: {dict(row)}"


def note_job_ids(state: Session, value: Any) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "job_id" and isinstance(inner, str):
                state.job_ids.add(inner)
            note_job_ids(state, inner)
    elif isinstance(value, list):
        for inner in value:
            note_job_ids(state, inner)


async def call(session: Session, name: str, arguments: dict[str, Any]) -> None:
    with anyio.fail_after(scaled(CALL_TIMEOUT_S)):
        try:
            result = await session.client.call_tool(name, arguments)
        except MCPError as exc:
            assert exc.error.code != INTERNAL_ERROR, (name, arguments, exc.error)
            return
        except UnicodeEncodeError:
            # The SDK client cannot serialize a surrogate in a key: nothing reached the
            # gateway (surrogates in values do reach it; test_bad_unicode sends raw bytes).
            return
    structured = result.structured_content or {}
    note_job_ids(session, structured)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert "Traceback" not in text, (name, arguments, text)
    if result.is_error:
        assert structured.get("error_kind") != "internal_error", (name, arguments, text)
        assert text.strip(), (name, arguments)


@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_arguments_never_cause_internal_error_or_half_written_jobs(
        session: Session, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(session.tools)), label="tool")
    schema = session.tools[name].input_schema
    arguments = data.draw(arguments_inside(schema) | arguments_outside(schema), label="args")
    if "job_id" in arguments and data.draw(st.booleans(), label="a known job"):
        known = sorted(session.job_ids) or ["none-yet"]
        arguments["job_id"] = data.draw(st.sampled_from(known), label="job_id")
    assert session.portal is not None
    session.portal.call(call, session, name, arguments)


# -- strict types (#23 item 9) ----------------------------------------------------------------

# Values of the wrong JSON type that pydantic's lax mode would coerce (or that are out of
# any sane range), per schema type: every one must be refused.
MISTYPED: dict[str, list[Any]] = {
    "boolean": ["true", "false", "yes", "True", "1", 1, 0, 1.0],
    "integer": ["5", 5.5, 5.0, True, 2**70, -(2**70)],
    "number": ["1.5", "30", True, 1e308, -1e308],
    "string": [5, 1.5, True, ["x"], {"a": "b"}],
    "enum": [5, True, "not-one-of-the-choices", ["x"]],
}


def scalar_kind(schema: dict[str, Any]) -> str | None:
    """"boolean", "integer", "number", "string" or "enum" for a scalar property (an optional
    one's `anyOf: [T, null]` included), None for a list or an object."""
    variants = [v for v in schema.get("anyOf", [schema]) if v.get("type") != "null"]
    if len(variants) != 1:
        return None
    (only,) = variants
    if "enum" in only:
        return "enum"
    kind = only.get("type")
    return kind if kind in ("boolean", "integer", "number", "string") else None


def scalar_properties(tool: Tool) -> dict[str, str]:
    return {name: kind for name, prop in tool.input_schema.get("properties", {}).items()
            if (kind := scalar_kind(prop)) is not None}


async def refused_as_invalid(session: Session, name: str, arguments: dict[str, Any]) -> bool:
    """Whether the call could be made (and then it was refused as invalid input): the SDK
    client cannot serialize a lone surrogate, so nothing reaches the gateway then."""
    try:
        with anyio.fail_after(scaled(CALL_TIMEOUT_S)):
            result = await session.client.call_tool(name, arguments)
    except UnicodeEncodeError:
        return False
    structured = result.structured_content or {}
    note_job_ids(session, structured)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error, (name, arguments, text)
    assert structured.get("error_kind") == "invalid_input", (name, arguments, text)
    return True


def test_every_number_in_every_tool_input_is_bounded(session: Session) -> None:
    """#23 item 9: no tool takes an unbounded number (2**70 tokens, 1e308 seconds)."""
    assert session.portal is not None
    session.portal.call(call, session, "llm_job_list", {})  # the store opens: the fixture reads it
    for tool in session.tools.values():
        for name, prop in tool.input_schema.get("properties", {}).items():
            for variant in prop.get("anyOf", [prop]):
                if variant.get("type") in ("integer", "number"):
                    assert {"minimum", "exclusiveMinimum"} & set(variant), (tool.name, name)
                    assert {"maximum", "exclusiveMaximum"} & set(variant), (tool.name, name)


@settings(max_examples=STRICT_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mistyped_arguments_are_refused_strictly_by_every_tool(
        session: Session, data: st.DataObject) -> None:
    """#23 item 9: over every tool and every scalar argument, a value of the wrong JSON type
    ("true" for a boolean, "5" or 5.0 for an integer, 2**70) is `invalid_input`, and no
    job is made; the other arguments are schema-valid."""
    candidates = sorted(n for n, t in session.tools.items() if scalar_properties(t))
    name = data.draw(st.sampled_from(candidates), label="tool")
    tool = session.tools[name]
    scalars = scalar_properties(tool)
    target = data.draw(st.sampled_from(sorted(scalars)), label="argument")
    wrong = data.draw(st.sampled_from(MISTYPED[scalars[target]]), label="value")
    arguments = data.draw(arguments_inside(tool.input_schema), label="args")
    arguments[target] = wrong
    before = set(session.job_ids)
    assert session.portal is not None
    # A surrogate drawn for another argument: a case the client cannot send (the other
    # property test sends those; test_bad_unicode sends raw bytes).
    assume(session.portal.call(refused_as_invalid, session, name, arguments))
    assert session.job_ids == before, "a refused call made a job"
