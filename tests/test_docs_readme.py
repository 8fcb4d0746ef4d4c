"""The README's first client snippet is what a new user copies first: it must work today.

The Claude Desktop JSON under "Install and connect a client" is read from the README, the
placeholder checkout path replaced by this checkout, and the gateway started exactly from it
by a real MCP client over stdio, with the bare environment a desktop client passes. The
Claude Code and Codex snippets must start the same command, and the project's links (README,
docs/) are relative and name files of this checkout.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.test_packaging import NETWORK_ENV, in_ci, real_executable, uv_cache_dir
from tests.waiting import scaled

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
PLACEHOLDER = "/abs/path/to/agent-cli-gateway"
# `uv run` syncs the checkout's .venv before the first answer; warm it is about a second,
# but a loaded 2-core box can take much longer, and a cold cache downloads the dependencies.
START_TIMEOUT_S = 240
DESKTOP_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"  # what Claude Desktop passes on macOS


def install_section() -> str:
    start = README.index("## Install and connect a client\n")
    end = README.index("\n## ", start + 1)
    return README[start:end]


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def first_client_snippet() -> dict[str, Any]:
    """The first JSON block of the install section: Claude Desktop's server entry."""
    config = json.loads(fenced_blocks(install_section(), "json")[0])
    server: dict[str, Any] = config["mcpServers"]["agent-cli-gateway"]
    return server


def test_the_first_snippet_is_the_from_checkout_form_that_needs_no_release() -> None:
    server = first_client_snippet()
    assert server["command"] == "uv"
    assert PLACEHOLDER in server["args"]
    assert "uvx" not in json.dumps(server)


def test_claude_code_and_codex_snippets_start_the_same_command_as_the_first() -> None:
    server = first_client_snippet()
    expected = [server["command"], *server["args"]]
    adds = [line for block in fenced_blocks(install_section(), "sh")
            for line in block.splitlines() if line.startswith("claude mcp add ")]
    assert adds, "no `claude mcp add` line in the install section"
    for line in adds:
        assert shlex.split(line.partition(" -- ")[2]) == expected, line
    codex = tomllib.loads(fenced_blocks(install_section(), "toml")[0])
    entry = codex["mcp_servers"]["agent-cli-gateway"]
    assert [entry["command"], *entry["args"]] == expected


def test_the_project_links_of_the_readme_and_the_docs_stay_in_the_checkout() -> None:
    """A link to the project's own pages is relative and names a file of this checkout (and
    a heading of it, for an anchor): it works in a clone, offline, and on the repository's
    web page alike, and always shows the docs of the version at hand. An absolute address
    of the project's repository left the checkout for whatever main says today."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    repository = project["urls"]["Repository"].removesuffix(".git")
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    seen_docs = False
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            where = f"{page.relative_to(REPO)}: {target}"
            assert not target.startswith(repository), f"absolute link to the project: {where}"
            if target.startswith(("https://", "http://", "mailto:")):
                continue  # another site's page (uv's installer, a spec)
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.is_file() and REPO in file.parents, f"no such file: {where}"
            seen_docs = seen_docs or "docs/" in target
            if anchor and file.suffix == ".md":
                assert anchor in anchors(file), f"no heading for #{anchor}: {where}"
    assert seen_docs, "the README links no page of docs/"


def test_the_readme_leads_to_the_five_minute_page() -> None:
    assert "(docs/how-it-works.md)" in README.split("## Install and connect a client")[0]


def anchors(markdown: Path) -> set[str]:
    """The anchors a renderer makes of a page's headings (GitHub's rule: lower case, spaces
    to dashes, punctuation but dashes and underscores dropped)."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown.read_text(encoding="utf-8"), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.anyio
async def test_the_gateway_starts_exactly_from_the_readmes_first_client_snippet(
        tmp_path: Path) -> None:
    server = first_client_snippet()
    uv = real_executable(server["command"])
    if uv is None:
        message = "uv not found on PATH (the README's step 1 installs it)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    args = [str(REPO) if arg == PLACEHOLDER else arg for arg in server["args"]]
    home = tmp_path / "home"
    home.mkdir()
    # A desktop client's environment: a minimal PATH, the user's HOME, nothing of this
    # shell's. The README says to put uv's absolute path in `command` for that PATH; the
    # fake CLIs stand in for the providers a user installed. The uv cache (and whatever
    # proxy uv needs on this machine) only spare the test a download.
    env = {
        "HOME": str(home),
        "PATH": os.pathsep.join([str(REPO / "tests" / "fakes" / "bin"), DESKTOP_PATH]),
        "UV_CACHE_DIR": uv_cache_dir(uv),
        "AGENT_GATEWAY_PERSISTENCE__PATH": str(tmp_path / "state" / "jobs.db"),
        **{k: v for k, v in os.environ.items() if k.startswith("UV_") or k in NETWORK_ENV},
    }
    params = StdioServerParameters(command=uv, args=args, env=env, cwd=str(home))
    with anyio.fail_after(scaled(START_TIMEOUT_S)):
        async with Client(params, mode="legacy", read_timeout_seconds=START_TIMEOUT_S) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            status = await client.call_tool("gateway_status", {})
    assert {"claude_request", "codex_request_async", "llm_job_wait", "gateway_status"} <= tools
    assert not status.is_error, status.content
    assert status.structured_content is not None
    assert status.structured_content["ready"] is True
    assert (tmp_path / "state" / "jobs.db").exists()
