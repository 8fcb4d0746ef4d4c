"""Every fenced block of README.md and docs/*.md is held to the code by a test (#25: six of
sixteen claims spot-checked had drifted). `CHECKS` names, for each block, the test that
checks it; a block no entry claims fails here, so a new example cannot go in unchecked.
The checks that need nothing but the text and the code live in this module; the ones that
need a running gateway or a doctor run live beside those (the entry names them)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.cli.main import build_parser
from gateway.config import ConfigError, Settings, load_settings
from gateway.model import JobStatus

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = ("README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    lang: str
    body: str

    @property
    def first(self) -> str:
        return self.body.splitlines()[0] if self.body else ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ```{self.lang} {self.first[:60]!r}"


def blocks() -> list[Block]:
    found = []
    for name in DOC_FILES:
        text = (REPO / name).read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            found.append(Block(name, text.count("\n", 0, match.start()) + 1, match.group(1),
                               match.group(2)))
    return found


# (file, language, how the block's first line starts) -> the test that checks the block.
CHECKS: dict[tuple[str, str, str], str] = {
    ("README.md", "sh", "uv run agent-cli-gateway"): "test_every_command_line_parses",
    ("README.md", "sh", "curl -LsSf https://astral.sh/uv/install.sh"):
        "test_the_uv_installer_is_astrals_own",
    ("README.md", "sh", "git clone"): "test_every_command_line_parses",
    ("README.md", "json", "{"): "tests/test_docs_readme.py",
    ("README.md", "sh", "claude mcp add"): "tests/test_docs_readme.py",
    ("README.md", "toml", "[mcp_servers.agent-cli-gateway]"): "tests/test_docs_readme.py",
    ("README.md", "sh", "export AGENT_GATEWAY_HTTP__AUTH_TOKEN"):
        "test_the_http_example_uses_real_names_and_defaults",
    ("README.md", "json", '{"mcpServers": {"agent-cli-gateway": {"command": "wsl.exe"'):
        "tests/mcp/test_unsupported_platform.py",
    ("README.md", "sh", "uv run pytest"): "test_the_readme_test_command_is_the_one_ci_runs",
    ("README.md", "text", "codex_request_async("): "tests/mcp/test_docs_examples.py",
    ("docs/architecture.md", "", "gateway/__main__.py"):
        "tests/test_docs_reference.py::test_every_repository_path_the_docs_and_the_code_name_exists",
    ("docs/architecture.md", "", "MCP tools (gateway/mcp/server.py"):
        "tests/test_docs_reference.py::test_every_repository_path_the_docs_and_the_code_name_exists",
    ("docs/architecture.md", "mermaid", "stateDiagram-v2"):
        "test_the_state_pictures_name_exactly_the_statuses",
    ("docs/architecture.md", "", "   admitted, no free slot"):
        "test_the_state_pictures_name_exactly_the_statuses",
    ("docs/configuration.md", "", "agent-cli-gateway: invalid configuration in"):
        "test_the_config_error_example_is_what_the_gateway_prints",
    ("docs/dashboard.md", "sh", "uv run agent-cli-gateway dashboard"):
        "test_every_command_line_parses",
    ("docs/operations.md", "mermaid", "flowchart LR"): "tests/test_docs_claims.py",
    ("docs/architecture.md", "mermaid", "sequenceDiagram"): "tests/test_docs_claims.py",
    ("README.md", "text", "llm_attempts("): "test_the_attempts_examples_use_the_tools_fields",
    ("docs/attempts.md", "json", '{"prompt": "fix add"'):
        "test_the_attempts_examples_use_the_tools_fields",
    ("docs/attempts.md", "text", "group "): "test_the_attempts_examples_use_the_tools_fields",
    ("README.md", "text", "agent-cli-gateway attempts run"):
        "test_the_attempts_run_examples_use_the_commands_options",
    ("docs/attempts.md", "text", "$ agent-cli-gateway attempts run"):
        "test_the_attempts_run_examples_use_the_commands_options",
    ("docs/attempts.md", "text", "agent-cli-gateway attempts run PROMPT"):
        "test_the_attempts_run_examples_use_the_commands_options",
    ("docs/attempts.md", "json", '{"job_id": "b9261272-...'):
        "test_the_attempts_examples_use_the_tools_fields",
    ("docs/operations.md", "toml", "[persistence]"): "test_every_gateway_config_example_loads",
    ("docs/operations.md", "toml", "[worker]"): "test_every_gateway_config_example_loads",
    ("docs/operations.md", "sh", "sqlite3 ~/.agent-cli-gateway/jobs.db"):
        "test_the_backup_commands_name_the_real_files_and_tables",
    ("docs/operations.md", "sh", "pg_dump"):
        "test_the_backup_commands_name_the_real_files_and_tables",
    ("docs/operations.md", "json", '{"action": "recover_expired_leases"'):
        "test_the_log_line_example_is_a_line_the_code_logs",
    ("docs/operations.md", "sh", "agent-cli-gateway jobs list"):
        "test_every_command_line_parses",
    ("docs/operations.md", "text", "From this shell:"):
        "tests/cli/test_doctor.py::test_doctor_on_a_shell_only_path_exits_0_with_a_verdict_per_context",
    **{("docs/providers.md", "", first): "test_each_provider_synopsis_names_only_flags_it_emits"
       for first in ("claude --print", "codex exec --json", "agy ", "grok ", "vibe ",
                     "devin --print", "cursor-agent --print")},
    ("docs/providers.md", "toml", "[api_providers.openrouter]"):
        "test_every_gateway_config_example_loads",
    ("docs/tools.md", "json", '{"job_id": "3d9be3fb-'): "tests/mcp/test_docs_examples.py",
    ("docs/tools.md", "mermaid", "sequenceDiagram"): "tests/test_docs_claims.py",
    ("docs/tools.md", "text", "→ codex_request_async("): "tests/mcp/test_docs_examples.py",
    ("docs/tools.md", "text", "offset = 0"): "tests/mcp/test_docs_examples.py",
    ("docs/tools.md", "text", "→ claude_request("): "tests/mcp/test_docs_examples.py",
}


def checks_of(block: Block) -> list[str]:
    return [test for (file, lang, first), test in CHECKS.items()
            if file == block.file and lang == block.lang and block.first.startswith(first)]


def blocks_checked_by(test: str) -> list[Block]:
    return [b for b in blocks() if test in checks_of(b)]


def test_every_block_of_the_docs_is_checked_by_a_test() -> None:
    unchecked = [str(b) for b in blocks() if not checks_of(b)]
    assert not unchecked, ("a docs block no test checks: add a check and name it in CHECKS "
                           f"{unchecked}")
    claimed = {key for b in blocks() for key, test in CHECKS.items() if test in checks_of(b)
               and b.file == key[0] and b.lang == key[1] and b.first.startswith(key[2])}
    assert set(CHECKS) - claimed == set(), "a CHECKS entry that matches no block: remove it"
    named = {test.partition("::")[0] for test in CHECKS.values()}
    for test in named:
        if test.startswith("tests/"):
            assert (REPO / test).is_file(), test
        else:
            assert test in globals(), test


# -- command lines -------------------------------------------------------------------------

PLACEHOLDERS = {"<id>": "0d5c", "N": "5", "S": "30", "M": "some-model", "D": "/tmp",
                "DAY": "2026-01-31", "PROVIDER": "claude", "PROMPT": "hi"}


def variants(synopsis: str) -> list[list[str]]:
    """The concrete argvs a synopsis line stands for: every optional part in, each
    alternative of `a|b` once, placeholders filled."""
    line = re.sub(r"[\[\]]", " ", synopsis)
    words = line.split()
    alternatives = [i for i, w in enumerate(words) if "|" in w]
    argvs = [[PLACEHOLDERS.get(w, w) for w in words]]
    for i in alternatives:
        for choice in words[i].split("|")[1:]:
            argv = list(argvs[0])
            argv[i] = choice
            argvs.append(argv)
    for argv in argvs:
        for i in alternatives:
            argv[i] = argv[i].split("|")[0] if "|" in argv[i] else argv[i]
    return argvs


def documented_command_lines() -> list[tuple[Block, str]]:
    """Each `agent-cli-gateway ...` line of the checked blocks, its comment cut off, the
    words after the program name (what `uv run` passes on too)."""
    lines = []
    for block in blocks_checked_by("test_every_command_line_parses"):
        for line in block.body.splitlines():
            command = line.split("  #")[0].split(" # ")[0].strip()
            found = re.search(r"(?:^|uv run )agent-cli-gateway\b(.*)$", command)
            if found:
                lines.append((block, found.group(1).strip()))
    return lines


def test_every_command_line_parses() -> None:
    lines = documented_command_lines()
    assert len(lines) >= 15, lines
    for block, synopsis in lines:
        for argv in variants(synopsis):
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                try:
                    build_parser().parse_args(argv)
                except SystemExit as exc:
                    # `--version` exits 0 after printing: that is the command working.
                    assert exc.code == 0, f"{block}: {argv}: {stderr.getvalue()}"


def test_every_synopsis_variant_is_concrete() -> None:
    assert variants("jobs list [--status running] [--json]") == [
        ["jobs", "list", "--status", "running", "--json"]]
    assert variants("worktrees [list|gc]") == [["worktrees", "list"], ["worktrees", "gc"]]
    assert variants("usage [--by provider|model]") == [["usage", "--by", "provider"],
                                                       ["usage", "--by", "model"]]


def test_the_readme_clone_is_of_the_projects_repository() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    clone = blocks_checked_by("test_every_command_line_parses")
    urls = re.findall(r"git clone (\S+)", "".join(b.body for b in clone))
    assert urls == [pyproject["project"]["urls"]["Repository"] + ".git"]


def test_the_uv_installer_is_astrals_own() -> None:
    (block,) = blocks_checked_by("test_the_uv_installer_is_astrals_own")
    # The documented installer of uv (docs.astral.sh/uv/getting-started/installation):
    # nothing of ours to drift but the address.
    assert block.body.strip() == "curl -LsSf https://astral.sh/uv/install.sh | sh"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    (block,) = blocks_checked_by("test_the_readme_test_command_is_the_one_ci_runs")
    commands = [line.split("#")[0].strip() for line in block.body.splitlines()]
    assert commands[0] == "uv run pytest", "the whole suite first"
    for command in commands[1:]:  # the fast tier: a marker pytest knows
        marker = command.partition("-m ")[2].strip('"').removeprefix("not ")
        pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
        assert re.search(rf'^\s*"{marker}:', pyproject, re.MULTILINE), command
    first = blocks()[0]
    assert "uv run pytest" in first.body, "the README's two set-up commands"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^\s*uv run --locked pytest\b", ci, re.MULTILINE), \
        ".ci/run must call the README's test command (with --locked)"


def env_name(*keys: str) -> str:
    return "AGENT_GATEWAY_" + "__".join(k.upper() for k in keys)


def test_the_http_example_uses_real_names_and_defaults() -> None:
    (block,) = blocks_checked_by("test_the_http_example_uses_real_names_and_defaults")
    assert env_name("http", "auth_token") in block.body
    assert "auth_token" in Settings.model_fields["http"].annotation.model_fields  # type: ignore[union-attr]
    http = Settings().http
    assert f"http://{http.host}:{http.port}{http.path}" in block.body
    serve = re.search(r"^uv run agent-cli-gateway (serve [^#]*)", block.body, re.MULTILINE)
    assert serve, block.body
    args = build_parser().parse_args(serve.group(1).split())
    assert args.transport == "http"


# -- config, logs, backups ----------------------------------------------------------------

def test_every_gateway_config_example_loads(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    examples = blocks_checked_by("test_every_gateway_config_example_loads")
    # operations.md: several hosts, a build box, a build box's checkouts
    assert len(examples) == 4, examples
    for i, block in enumerate(examples):
        path = tmp_path / f"example-{i}.toml"
        path.write_text(block.body, encoding="utf-8")
        try:
            load_settings(path)
        except ConfigError as exc:
            pytest.fail(f"{block} is not a valid config: {exc}")


def test_the_config_error_example_is_what_the_gateway_prints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's example (its bad values quoted) and the variable's (its value never)."""
    in_file, in_env = blocks_checked_by("test_the_config_error_example_is_what_the_gateway_prints")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in list(os.environ):
        if name.startswith("AGENT_GATEWAY_"):
            monkeypatch.delenv(name)
    path = tmp_path / "config.toml"
    path.write_text("[lease]\nttl = 5\n[limits]\nmax_running_jobs = 0\n", encoding="utf-8")
    documented = in_file.body.replace("/home/me/.agent-cli-gateway/config.toml", str(path))
    assert printed_error(path) == documented.strip().splitlines()
    monkeypatch.setenv("AGENT_GATEWAY_HTTP__PORT", "sk-pasted-here")
    assert printed_error(None) == in_env.body.strip().splitlines()


def printed_error(path: Path | None) -> list[str]:
    """What a command prints for the configuration it would load (exit 2)."""
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    return f"agent-cli-gateway: {raised.value}".strip().splitlines()


def test_the_log_line_example_is_a_line_the_code_logs() -> None:
    (block,) = blocks_checked_by("test_the_log_line_example_is_a_line_the_code_logs")
    record = json.loads(block.body)
    assert {"event", "level", "timestamp", "action"} <= set(record)
    sources = "".join(p.read_text(encoding="utf-8") for p in (REPO / "gateway").rglob("*.py"))
    # The event and its action are logged together, at that level.
    logged = re.search(
        rf'log\.{record["level"]}\(\s*"{re.escape(record["event"])}"[^)]*?'
        rf'action="{record["action"]}"', sources, re.DOTALL)
    assert logged, f"no log.{record['level']}({record['event']!r}, action={record['action']!r})"


def test_the_backup_commands_name_the_real_files_and_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite_block, pg_block = blocks_checked_by(
        "test_the_backup_commands_name_the_real_files_and_tables")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AGENT_GATEWAY_PERSISTENCE__PATH", raising=False)
    default_db = Settings().persistence.path
    assert f"sqlite3 {str(default_db).replace(str(tmp_path), '~')} " in sqlite_block.body
    sql = "".join(p.read_text(encoding="utf-8") for p in (REPO / "gateway" / "store").rglob("*.py"))
    created = set(re.findall(r"CREATE TABLE\s+(?:IF NOT EXISTS\s+)?(\w+)", sql))
    tables = re.findall(r"--table=(\w+)", pg_block.body)
    assert tables and set(tables) <= created, (tables, created)
    assert f"${env_name('persistence', 'dsn')}" in pg_block.body
    assert "dsn" in type(Settings().persistence).model_fields


# -- pictures and provider synopses -------------------------------------------------------

def test_the_state_pictures_name_exactly_the_statuses() -> None:
    statuses = {s.value for s in JobStatus}
    for block in blocks_checked_by("test_the_state_pictures_name_exactly_the_statuses"):
        named = set(re.findall(r"\b(" + "|".join(sorted(statuses)) + r")\b", block.body))
        assert named == statuses, (str(block), statuses - named)
        if block.lang == "mermaid":
            states = set(re.findall(r"^\s*(\w+) -->", block.body, re.MULTILINE))
            states |= set(re.findall(r"--> (\w+)", block.body)) - {"[*]"}
            assert states == statuses, (str(block), states ^ statuses)


def test_each_provider_synopsis_names_only_flags_it_emits() -> None:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "fakes"))
    from argv_cases import (  # type: ignore[import-not-found]
        DIALECTS,
        MODEL_VALUES,
        SESSION_VALUES,
        option_sets,
        provider,
        request,
    )

    from providers.base import InvalidRequest

    # One synopsis per dialect: a line at column 0 starts one (gemini's shares agy's block).
    # An `env: NAME=<value>` line names a variable the adapter sets instead of a flag.
    synopses: dict[str, str] = {}
    env_notes: dict[str, set[str]] = {}
    binary = ""
    for block in blocks_checked_by("test_each_provider_synopsis_names_only_flags_it_emits"):
        for line in block.body.splitlines():
            if line.startswith("env:"):
                env_notes.setdefault(binary, set()).update(re.findall(r"(\w+)=", line))
                continue
            if not line.startswith(" "):
                binary = line.split()[0]
            synopses[binary] = synopses.get(binary, "") + line + "\n"
    assert set(synopses) == {binary for _, binary in DIALECTS}, set(synopses)
    for name, binary in DIALECTS:
        adapter = provider(name)
        emitted: set[str] = set()
        env_set: set[str] = set()
        stdin_used = False
        for options in option_sets(adapter):
            for session_id in SESSION_VALUES:
                for model in MODEL_VALUES:
                    req = request(adapter, options, prompt="hi", session_id=session_id,
                                  model=model)
                    try:
                        invocation = adapter.build_invocation(req, binary)
                    except InvalidRequest:
                        continue
                    emitted |= {a.split("=")[0] for a in invocation.argv if a.startswith("-")}
                    stdin_used |= invocation.stdin is not None
                    env_set |= set(invocation.env)
        synopsis = synopses[binary]
        documented = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", synopsis))
        assert documented <= emitted, (binary, sorted(documented - emitted))
        assert env_notes.get(binary, set()) <= env_set, (binary, env_notes[binary] - env_set)
        if "prompt on stdin" in synopsis:
            assert stdin_used, f"{binary}: the synopsis says stdin, the adapter never uses it"


def test_the_attempts_examples_use_the_tools_fields() -> None:
    """The attempts examples (README, docs/attempts.md) call the tools with their real
    arguments, show rows with the fields docs/tools.md documents, and a table whose ranks
    follow the ranking rule."""
    import inspect

    from gateway.mcp.attempt_tools import attempt_tools

    tools = {name: set(inspect.signature(body).parameters) - {"ctx"}
             for name, body, _ in attempt_tools(None)}  # type: ignore[arg-type]
    readme = next(b for b in blocks() if b.file == "README.md" and b.first.startswith(
        "llm_attempts("))
    for call in re.finditer(r"^(llm_attempts\w*)\((.*?)\)\s*(?:#.*)?\n\s*(?:->|$)",
                            readme.body + "\n", re.MULTILINE | re.DOTALL):
        names = set(re.findall(r"(\w+)=", call.group(2)))
        assert names <= tools[call.group(1)], (call.group(1), names - tools[call.group(1)])
    doc = [b for b in blocks() if b.file == "docs/attempts.md"]
    call = json.loads(next(b for b in doc if b.first.startswith('{"prompt"')).body)
    assert set(call) <= tools["llm_attempts"]
    row_text = next(b for b in doc if b.first.startswith('{"job_id"')).body
    row = json.loads(row_text.replace('"b9261272-..."', '"b9261272"'))
    status_doc = (REPO / "docs/tools.md").read_text(encoding="utf-8").split(
        "## llm_attempts_status", 1)[1].split("## llm_attempts_pick", 1)[0]
    for key in [*row, *row["changes"], *row["check"]]:
        assert f"`{key}`" in status_doc, key
    table = next(b for b in doc if b.lang == "text" and b.first.startswith("group "))
    ranks = {"check passed": 1, "check failed": 3, "no check (no_changes)": 4}
    lines = table.body.splitlines()[1:-1]
    for line in lines:
        match = re.fullmatch(r"  (\d)  \S+  \w+\s+completed \+\d+/-\d+ in \d+ files  (.+)", line)
        assert match is not None, line
        shown = re.sub(r" \(\d+\)$", "", match.group(2))
        assert int(match.group(1)) == ranks[shown], line



def test_the_attempts_run_examples_use_the_commands_options() -> None:
    """Every `attempts run` line of the docs parses with the real command line (options
    that exist, values where they need one), and the example's output ends with a winner."""
    examples = [b for b in blocks() if "attempts run" in b.first]
    assert len(examples) == 3
    parser = build_parser()
    for block in examples:
        text = block.body.replace("\\\n", " ")
        line = next(x for x in text.splitlines() if "attempts run" in x)
        argv = shlex.split(line.split("agent-cli-gateway", 1)[1])
        argv = [re.sub(r"^\[|\]$", "", arg) for arg in argv if arg not in ("[", "]")]
        argv = [arg for arg in argv if arg != "|"]
        parsed = parser.parse_args(argv)
        assert parsed.attempts_command == "run" and parsed.target, block.first
        if block.first.startswith("$"):
            assert re.search(r"^winner: \S+ \(judge \(grok\): ", text, re.MULTILINE)
