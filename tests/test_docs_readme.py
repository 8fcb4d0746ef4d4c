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
import secrets
import shlex
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from gateway import platform
from gateway.config import Settings
from tests.children import kill
from tests.mcp.conftest import free_port
from tests.test_packaging import NETWORK_ENV, in_ci, real_executable, uv_cache_dir
from tests.waiting import scaled, wait_until

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


# -- the README's first hour, run as written (#44) -------------------------------------------


def readme_block(after: str, language: str = "sh") -> str:
    """The first `language` block after the README line that starts with `after`."""
    start = README.index(after)
    return fenced_blocks(README[start:], language)[0]


def shell_lines(block: str) -> list[list[str]]:
    """Each command line of a block as argv (comments dropped, as a shell would)."""
    return [argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))]


def needed_uv() -> str:
    uv = real_executable("uv")
    if uv is None:
        message = "uv not found on PATH (the README's step 1 installs it)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    assert uv is not None
    return uv


def newcomer_env(tmp_path: Path, uv: str, **extra: str) -> dict[str, str]:
    """A fresh HOME and a clean PATH: uv (step 1), the system's bin dirs and the provider CLIs
    a user installed (the fakes stand in for them). The uv cache and whatever proxy uv needs
    here only spare the test a download."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    path = [str(REPO / "tests" / "fakes" / "bin"), str(Path(uv).parent), "/usr/bin", "/bin"]
    return {"HOME": str(home), "PATH": os.pathsep.join(path), "UV_CACHE_DIR": uv_cache_dir(uv),
            **{k: v for k, v in os.environ.items() if k.startswith("UV_") or k in NETWORK_ENV},
            **extra}


def test_the_readmes_checkout_commands_run_as_written_in_a_fresh_home(tmp_path: Path) -> None:
    """Step 2 of the README after its `git clone ... && cd ...` (this checkout stands for
    the clone), then the first commands it names (`config show`, `jobs list`) in the form it
    tells a checkout to use: each works with a fresh HOME and a clean PATH, no traceback."""
    uv = needed_uv()
    clone, *commands = shell_lines(readme_block("**2. Get the gateway"))
    assert clone[:2] == ["git", "clone"] and clone[-3:] == ["&&", "cd", "agent-cli-gateway"]
    named = [["uv", "run", "agent-cli-gateway", "config", "show"],
             ["uv", "run", "agent-cli-gateway", "jobs", "list"]]
    for argv in named:  # the README names them as `agent-cli-gateway ...` and says: prefix uv run
        assert f"`{shlex.join(argv[2:])}" in README, argv
    assert "`uv run agent-cli-gateway ...`" in README
    expected = {"--version": "agent-cli-gateway ", "doctor": "Ready", "config": "[persistence]",
                "jobs": "No jobs yet"}
    env = newcomer_env(tmp_path, uv)
    for argv in [*commands, *named]:
        assert argv[:3] == ["uv", "run", "agent-cli-gateway"], argv
        done = subprocess.run([uv, *argv[1:]], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=scaled(START_TIMEOUT_S), check=False,
                              stdin=subprocess.DEVNULL)
        said = done.stdout + done.stderr
        assert done.returncode == 0 and "Traceback" not in said, (argv, said[-2000:])
        assert expected[argv[3]] in said, (argv, said[-2000:])


def test_the_readmes_http_block_serves_with_its_token_and_stops_on_ctrl_c(
        tmp_path: Path) -> None:
    """The "Over HTTP" block, run as written in the checkout: the token it exports guards
    /mcp, /healthz answers without it, and Ctrl-C (SIGINT to the terminal's process group)
    stops the server. Only the port is another (a free one: tests run side by side)."""
    uv = needed_uv()
    export, serve = shell_lines(readme_block("### Over HTTP"))
    assert export == ["export", "AGENT_GATEWAY_HTTP__AUTH_TOKEN=$(openssl rand -hex 32)"]
    assert serve == ["uv", "run", "agent-cli-gateway", "serve", "--transport", "http"]
    assert "http://127.0.0.1:8765/mcp" in readme_block("### Over HTTP")
    assert (Settings().http.host, Settings().http.port) == ("127.0.0.1", 8765)
    token = secrets.token_hex(32)  # what `openssl rand -hex 32` prints
    port = free_port()
    env = newcomer_env(tmp_path, uv, AGENT_GATEWAY_HTTP__AUTH_TOKEN=token,
                       AGENT_GATEWAY_HTTP__PORT=str(port))
    err = tmp_path / "serve.stderr"
    with err.open("wb") as sink:
        server = subprocess.Popen([uv, *serve[1:]], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx2.Client(timeout=scaled(10)) as http:
            wait_until(lambda: ready(http, f"{base}/healthz"), "/healthz to say ready",
                       timeout=START_TIMEOUT_S)
            hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            headers = {"Accept": "application/json, text/event-stream"}
            assert http.post(f"{base}/mcp", json=hello, headers=headers).status_code == 401
            authorized = http.post(f"{base}/mcp", json=hello,
                                   headers={**headers, "Authorization": f"Bearer {token}"})
            assert authorized.status_code != 401, authorized.text
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(scaled(30))
        except subprocess.TimeoutExpired:
            raise AssertionError("Ctrl-C did not stop the server: "
                                 + err.read_text(errors="replace")[-3000:]) from None
    finally:
        kill(server)
    said = err.read_text(errors="replace")
    assert "Traceback" not in said and token not in said, said[-2000:]


def ready(http: httpx2.Client, url: str) -> bool:
    """/healthz answers and says the gateway is ready (its store open: it serves jobs)."""
    try:
        answer = http.get(url)
    except httpx2.TransportError:
        return False
    return answer.status_code == 200 and bool(answer.json().get("ready"))


def test_the_wsl_snippet_is_the_checkout_form_the_gateway_prints() -> None:
    """The README's WSL entry (it cannot run here) is the first snippet's command behind
    `wsl.exe`, with the clone's path inside WSL, and the very text the gateway answers on
    native Windows (gateway/platform: WSL_SNIPPET)."""
    block = readme_block("**Windows, through WSL.**", "json").strip()
    wsl = json.loads(block)["mcpServers"]["agent-cli-gateway"]
    first = first_client_snippet()
    assert wsl["command"] == "wsl.exe"
    assert wsl["args"] == [platform.WSL_CHECKOUT if a == PLACEHOLDER else a
                           for a in [first["command"], *first["args"]]]
    assert json.loads(platform.WSL_SNIPPET) == json.loads(block)
    assert "uvx" not in block
