"""The names docs/*.md and the README use exist in the code, and the lists they give are whole.

A renamed config key, a new error kind, a provider option, a tool argument, a log action or
a CLI flag that the docs no longer match fails here, not in a user's hands. The code is
walked (config model, ErrorKind, options models, registered tools, argparse tree, source
files), never copied into this file.
"""

from __future__ import annotations

import argparse
import re
import typing
from pathlib import Path

import pytest

from gateway.cli.main import build_parser
from gateway.config import PROVIDER_NAMES, Settings
from gateway.model import ErrorKind, JobRow
from providers.registry import CLI_PROVIDERS

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SOURCE_DIRS = (REPO / "gateway", REPO / "providers")
# The docs that describe this code; configuration.md has its own test (test_docs_config.py).
DOC_FILES = ("architecture.md", "operations.md", "providers.md", "tools.md")
# Error kinds the MCP layer answers besides ErrorKind (a tool body crashed).
EXTRA_TOOL_ERROR_KINDS = {"internal_error"}
# `action=name` in gateway/jobs/leases.py: a failing tick logs under its loop's name.
LEASE_LOOP_ACTIONS = {"heartbeat", "reaper", "cancel_poller"}


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of the markdown section `heading` (up to the next heading of its level)."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    match = re.search(rf"^{re.escape(level)} ", rest, re.MULTILINE)
    return rest[: match.start()] if match else rest


def body_rows(table_text: str) -> list[str]:
    """The rows of the markdown tables in `table_text`, header rows left out."""
    lines = table_text.splitlines()
    return [line for i, line in enumerate(lines) if line.startswith("|")
            and not line.startswith("|---")
            and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))]


def first_cells(table_text: str) -> list[str]:
    """The backticked name that opens the first cell of each table body row."""
    return [m.group(1) for row in body_rows(table_text) if (m := re.match(r"\| `([^`]+)`", row))]


def config_keys() -> dict[str, set[str]]:
    """'lease' -> its keys ...; 'providers.<name>' -> the keys of one provider's table."""
    keys: dict[str, set[str]] = {}
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            keys[f"{name}.<name>"] = set(typing.get_args(annotation)[1].model_fields)
        else:
            keys[name] = set(annotation.model_fields)  # type: ignore[union-attr]
    return keys


def source_actions() -> set[str]:
    found: set[str] = set()
    for directory in SOURCE_DIRS:
        for path in directory.rglob("*.py"):
            found |= set(re.findall(r'\baction="([a-z_]+)"', path.read_text(encoding="utf-8")))
    # argparse's `action="store_true"` and friends are not log actions.
    return found - {"store_true", "append", "version", "store", "count"}


def test_every_config_key_the_docs_name_exists() -> None:
    keys = config_keys()
    texts = {name: read(name) for name in DOC_FILES}
    texts["README.md"] = (REPO / "README.md").read_text(encoding="utf-8")
    problems = []
    for doc, text in texts.items():
        for table, named, key in re.findall(
                r"`\[([a-z_]+)(\.(?:<name>|[a-z_]+))?\] ([a-z_]+)`", text):
            # `[providers.gemini] env` is a key of the `[providers.<name>]` template.
            section_name = f"{table}.<name>" if named else table
            if section_name == "section":
                continue  # the notation itself, as the docs introduce it
            if key not in keys.get(section_name, set()):
                problems.append(f"{doc}: [{table}{named}] {key}")
    assert not problems, f"config keys the model does not have: {problems}"


def test_the_tools_doc_lists_exactly_the_error_kinds_a_caller_can_get() -> None:
    table = section(read("tools.md"), "## Errors")
    documented = set(first_cells(table))
    expected = {kind.value for kind in ErrorKind} | EXTRA_TOOL_ERROR_KINDS
    assert documented == expected


def test_the_architecture_doc_names_every_column_of_the_jobs_table() -> None:
    tables = section(read("architecture.md"), "## The tables")
    paragraph = tables[tables.index("`jobs`:"): tables.index("Indexes:")]
    mentioned = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert set(JobRow.column_names()) <= mentioned


@pytest.mark.parametrize("provider", PROVIDER_NAMES)
def test_the_providers_doc_lists_exactly_each_providers_options(provider: str) -> None:
    body = section(read("providers.md"), f"## {provider}")
    documented = set(first_cells(body))
    options = set(CLI_PROVIDERS[provider].options_model.model_fields)
    assert documented == options


def test_the_providers_doc_names_each_providers_login_and_install_commands() -> None:
    text = read("providers.md")
    for provider in PROVIDER_NAMES:
        body = section(text, f"## {provider}")
        adapter = CLI_PROVIDERS[provider]
        for binary in adapter.commands:
            assert binary in body, (provider, binary)
        for command in re.findall(r"`([^`]+)`", adapter.login_hint):
            assert command in body, (provider, "login", command)
        install = re.findall(r"`([^`]+)`", adapter.install_hint) or [adapter.install_hint]
        assert any(part.split(" (")[0] in body for part in install), (provider, "install")


@pytest.mark.anyio
async def test_the_tools_doc_names_every_tool_and_every_job_tool_argument() -> None:
    from gateway.mcp.server import build_server
    from gateway.mcp.server_state import ServerState
    from gateway.mcp.tools import request_tools

    # Only the tool list is read: the lifespan (store, leases) never starts. The provider
    # tools are listed only where their CLI is installed, so they are built directly.
    schemas = {tool.name: tool.input_schema
               for tool in await build_server(Settings()).list_tools()}
    state = ServerState(Settings(), "stdio")
    schemas |= {tool.name: tool.parameters for provider in PROVIDER_NAMES
                for tool in request_tools(state, provider)}
    text = read("tools.md")
    job_tools = {name for name in schemas if not name.endswith(("_request", "_request_async"))}
    for name in job_tools:
        body = section(text, f"## {name}")
        documented = set(first_cells(body))
        arguments = set(schemas[name].get("properties", {}))
        assert documented >= arguments, (name, arguments - documented)
    for provider in PROVIDER_NAMES:
        assert f"{provider}_request" in schemas and f"{provider}_request_async" in schemas
    common = set(first_cells(section(text, "### Inputs of a CLI provider's tools")))
    from providers.registry import REPORTS_COST

    for provider in PROVIDER_NAMES:
        arguments = set(schemas[f"{provider}_request"]["properties"])
        options = set(CLI_PROVIDERS[provider].options_model.model_fields)
        # max_cost_usd only where the CLI reports a cost and can stop at a cap
        expected = common if provider in REPORTS_COST else common - {"max_cost_usd"}
        assert arguments - options == expected, provider


def test_every_log_action_the_operations_doc_lists_is_logged_by_the_code_and_vice_versa() -> None:
    table = section(read("operations.md"), "## Reading the logs")
    cells = [row.split("|")[1] for row in body_rows(table)]
    documented = {name for cell in cells for name in re.findall(r"`([a-z_]+)`", cell)}
    logged = source_actions() | LEASE_LOOP_ACTIONS
    assert documented - logged == set(), "documented in docs/operations.md but never logged"
    assert source_actions() - documented == set(), (
        "logged but missing from the action table of docs/operations.md: add a row")


def _cli_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags: set[str] = set()
    for action in parser._actions:
        flags |= {s for s in action.option_strings if s.startswith("--")}
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _cli_flags(sub)
    return flags


def test_every_cli_flag_in_a_documented_command_exists() -> None:
    flags = _cli_flags(build_parser())
    texts = [read(name) for name in DOC_FILES] + [(REPO / "README.md").read_text("utf-8")]
    used: set[str] = set()
    for text in texts:
        for line in text.splitlines():
            if line.lstrip().startswith("{"):  # a client's JSON config names the server
                continue
            # Each mention up to the next one; in `claude mcp add agent-cli-gateway -- uv run
            # --directory ... agent-cli-gateway` the name is a server's, and what follows
            # ` -- ` is another program's command line.
            starts = [m.start() for m in re.finditer(r"(?<![\w/.-])agent-cli-gateway\b", line)]
            ends = [*starts[1:], len(line)] if starts else []
            for start, end in zip(starts, ends, strict=True):
                command = re.split(r"`|#", line[start:end])[0]
                if " -- " not in command:
                    used |= set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", command))
    assert used, "no documented command line found"
    assert used <= flags, sorted(used - flags)


# A path into this repository, as docs and comments write it (`gateway/jobs/run/spool.py`).
REPO_PATH = re.compile(r"(?<![\w./-])((?:gateway|providers|neutral|tests|bench|scripts|docs|\.ci)/"
                       r"[\w./*<>-]*[\w*>/])")
GENERATED_DIRS = ("bench/results",)  # written by the benchmarks, not in the repository


def test_every_repository_path_the_docs_and_the_code_name_exists() -> None:
    texts = [REPO / "README.md", *DOCS.glob("*.md"), *(REPO / "bench").glob("*.md"),
             *(REPO / "scripts").glob("*"), REPO / ".ci" / "run"]
    for top in ("gateway", "providers", "neutral", "tests", "bench"):
        texts += (REPO / top).rglob("*.py")
    missing = []
    for path in texts:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in REPO_PATH.finditer(line):
                named = match.group(1).rstrip(".")
                if "*" in named or "<" in named or named.startswith(GENERATED_DIRS):
                    continue  # a pattern (`providers/<name>.py`) or a benchmark's output
                if not (REPO / named).exists():
                    missing.append(f"{path.relative_to(REPO)}:{number}: {named}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)
