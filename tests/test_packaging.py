"""The wheel, built and run the way MCP clients run it: `uvx --from <wheel> agent-cli-gateway`
spoken to by a real MCP client over stdio (Claude Desktop, Claude Code and Codex all start
`uvx agent-cli-gateway`); and every package the code imports declared in pyproject.toml."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import packages_distributions, version
from pathlib import Path, PurePosixPath

import anyio
import pytest
from mcp import Client, StdioServerParameters
from packaging.requirements import Requirement

from gateway.cli.main import EXAMPLE_CONFIG
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 180  # uv fetches hatchling from PyPI on a cold cache
# A cold uv cache downloads ~30 packages before the server can answer `initialize`.
UVX_TIMEOUT_S = 240
NETWORK_ENV = frozenset({"SSL_CERT_FILE", "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY",
                         "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
                         "all_proxy"})


# posix_detach, supervisor and handoff: gateway/platform/posix_detach.py and
# gateway/jobs/run/{supervisor,handoff}.py as the zygote imports them, top-level (its isolated
# interpreter has their folders on its path and no gateway package).
PRODUCT_PACKAGES = ("gateway", "providers", "neutral")  # what the wheel installs
FIRST_PARTY = frozenset({"gateway", "providers", "neutral", "posix_detach", "supervisor", "handoff"})


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def real_executable(name: str) -> str | None:
    """`name` on PATH, seen through a pyenv shim (a shim needs the user's own HOME)."""
    found = shutil.which(name)
    if found is None:
        return None
    with open(found, "rb") as fh:
        is_shim = fh.read(2) == b"#!" and b"pyenv" in Path(found).read_bytes()
    if is_shim and shutil.which("pyenv"):
        answer = subprocess.run(["pyenv", "which", name], capture_output=True, text=True,
                                timeout=scaled(30), check=False)
        if answer.returncode == 0 and answer.stdout.strip():
            return answer.stdout.strip()
    return found


@pytest.fixture(scope="module")
def uv_tools() -> tuple[str, str]:
    uv, uvx = real_executable("uv"), real_executable("uvx")
    if uv is None or uvx is None:
        message = "uv/uvx not found on PATH (install uv: pip install uv)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return uv, uvx


@pytest.fixture(scope="module")
def wheel(uv_tools: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv, _ = uv_tools
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([uv, "build", "--wheel", "-o", str(out)], cwd=REPO,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert build.returncode == 0, build.stderr
    wheels = list(out.glob("agent_cli_gateway-*.whl"))
    assert len(wheels) == 1, (wheels, build.stderr)
    return wheels[0]


def uv_cache_dir(uv: str) -> str:
    answer = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=scaled(30),
                            check=True)
    return answer.stdout.strip()


def test_the_wheel_holds_both_packages_the_example_config_and_the_console_script(
        wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    for module in ("gateway/__init__.py", "gateway/__main__.py", "gateway/cli/main.py",
                   "gateway/mcp/server.py", "gateway/mcp/tools.py", "gateway/mcp/http.py",
                   "gateway/runtime.py", "gateway/jobs/manager.py", "gateway/store/sqlite/store.py",
                   "providers/__init__.py", "providers/registry.py", "providers/claude.py",
                   "gateway/jobs/http_call.py"):
        assert module in names, module
    # `agent-cli-gateway init` copies the example out of the installed package: the
    # repository's one copy, put there from its root by pyproject's force-include.
    hatch = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["hatch"]
    packaged = hatch["build"]["targets"]["wheel"]["force-include"][EXAMPLE_CONFIG]
    assert PurePosixPath(packaged) == PurePosixPath("gateway", EXAMPLE_CONFIG)  # what init reads
    with zipfile.ZipFile(wheel) as archive:
        example = archive.read(packaged)
    assert example == (REPO / EXAMPLE_CONFIG).read_bytes()
    assert "agent-cli-gateway = gateway.entry:main" in entry_points
    assert not any(n.startswith("tests/") for n in names)


def test_asyncpg_is_only_in_the_postgres_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist()
                        if n.endswith(".dist-info/METADATA"))
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]
    assert "Provides-Extra: postgres" in metadata
    asyncpg = [r for r in requires if r.startswith("asyncpg")]
    assert asyncpg and all("extra == 'postgres'" in r or 'extra == "postgres"' in r
                           for r in asyncpg), asyncpg
    assert any(r.startswith("mcp") and "extra" not in r for r in requires)


def test_the_wheel_metadata_has_the_license_classifiers_and_project_urls(wheel: Path) -> None:
    """What a package index page shows: the license (and its text), the classifiers and
    the links back to the repository, docs, issues and changelog."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(archive.read(n).decode() for n in names
                        if n.endswith(".dist-info/METADATA"))
        license_text = next(archive.read(n).decode() for n in names
                            if n.endswith(".dist-info/licenses/LICENSE"))
    fields = [line.partition(": ") for line in metadata.splitlines() if ": " in line]
    assert ("License-Expression", ": ", "MIT") in fields
    assert license_text.startswith("MIT License")
    classifiers = [value for key, _, value in fields if key == "Classifier"]
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    urls = {value.partition(", ")[0] for key, _, value in fields if key == "Project-URL"}
    assert {"Homepage", "Repository", "Documentation", "Issues", "Changelog"} <= urls


def test_the_sdist_holds_the_source_and_no_tests_benchmarks_ci_or_caches(
        uv_tools: tuple[str, str], tmp_path: Path) -> None:
    uv, _ = uv_tools
    # A test cache in the checkout, as any hypothesis run leaves one: it must stay out.
    (REPO / ".hypothesis").mkdir(exist_ok=True)
    build = subprocess.run([uv, "build", "--sdist", "-o", str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert build.returncode == 0, build.stderr
    (sdist,) = tmp_path.glob("agent_cli_gateway-*.tar.gz")
    with tarfile.open(sdist) as archive:
        tops = {name.split("/")[1] for name in archive.getnames() if name.count("/") >= 1}
    assert {"gateway", "providers", "neutral", "docs", "README.md", "LICENSE",
            "pyproject.toml", "config.example.toml"} <= tops
    assert not tops & {".hypothesis", "tests", "bench", ".ci", ".pytest_cache", ".venv",
                       "scripts", "dist"}, sorted(tops)


def test_the_postgres_backend_without_asyncpg_says_exactly_what_to_install(
        tmp_path: Path) -> None:
    """A wheel installed without the extra: importing asyncpg fails (here: made to fail
    in a child process), and opening the store says which command fixes it, permanently."""
    script = (
        "import asyncio, sys\n"
        "sys.modules['asyncpg'] = None  # as if the extra was not installed\n"
        "from gateway.config import load_settings\n"
        "from gateway.store import StoreUnavailable, open_store\n"
        "settings = load_settings(persistence={'backend': 'postgres',\n"
        "                                      'dsn': 'postgresql://u@127.0.0.1:1/db'})\n"
        "try:\n"
        "    asyncio.run(open_store(settings))\n"
        "except StoreUnavailable as exc:\n"
        "    print(exc.permanent, exc)\n")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("AGENT_GATEWAY_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True ")
    assert "agent-cli-gateway[postgres]" in done.stdout
    assert "uvx --from 'agent-cli-gateway[postgres]' agent-cli-gateway" in done.stdout


async def test_uvx_runs_the_wheel_as_an_mcp_stdio_server(
        wheel: Path, uv_tools: tuple[str, str], tmp_path: Path) -> None:
    uv, uvx = uv_tools
    home = tmp_path / "home"
    home.mkdir()
    # What an MCP client passes (the SDK's stdio client passes only a whitelist), plus the
    # uv cache so the test does not download every dependency again.
    env = {
        "HOME": str(home),
        # The fake CLIs: the provider tools are listed where a CLI is found.
        "PATH": os.pathsep.join([str(REPO / "tests" / "fakes" / "bin"), str(Path(uvx).parent),
                                 str(Path(sys.executable).parent), os.defpath]),
        "UV_CACHE_DIR": uv_cache_dir(uv),
        "AGENT_GATEWAY_PERSISTENCE__PATH": str(tmp_path / "state" / "jobs.db"),
        # uv reaches PyPI through whatever proxy and CA bundle this machine needs.
        **{k: v for k, v in os.environ.items() if k.startswith("UV_") or k in NETWORK_ENV},
    }
    params = StdioServerParameters(command=uvx, args=["--from", str(wheel), "agent-cli-gateway"],
                                   env=env, cwd=str(home))
    with anyio.fail_after(scaled(UVX_TIMEOUT_S)):
        async with Client(params, mode="legacy", read_timeout_seconds=UVX_TIMEOUT_S) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            # Any job tool waits for the store to open; afterwards the status is ready.
            listed = await client.call_tool("llm_job_list", {})
            status = await client.call_tool("gateway_status", {})
    assert {"claude_request", "codex_request_async", "llm_job_wait", "gateway_status"} <= tools
    assert not listed.is_error, listed.content
    assert not status.is_error, status.content
    assert status.structured_content is not None
    assert status.structured_content["ready"] is True
    assert status.structured_content["backend"] == "sqlite"
    assert (tmp_path / "state" / "jobs.db").exists()
    # The real ~/.agent-cli-gateway was never touched: the store is where the env says.
    assert not (home / ".agent-cli-gateway" / "jobs.db").exists()


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level_modules(*packages: str) -> dict[str, set[str]]:
    """Every top-level module imported anywhere in `packages` (inside functions too), with
    the files that import it. Relative imports are first-party and skipped."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.partition(".")[0], set()).add(
                        str(path.relative_to(REPO)))
    return found


def test_every_package_the_code_imports_is_a_declared_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = [spec for specs in project.get("optional-dependencies", {}).values()
              for spec in specs]
    declared = {_normalized(re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0])
                for spec in [*project["dependencies"], *extras]}
    distributions = packages_distributions()
    missing: dict[str, list[str]] = {}
    imported = imported_top_level_modules(*PRODUCT_PACKAGES)
    # The postgres extra's driver is imported by the PostgreSQL store alone, which is
    # imported only when it is the configured backend (gateway/store/__init__.py).
    # The PostgreSQL store is split by concern into the modules of its folder.
    store = "gateway/store/postgres/"
    assert all(path.startswith(store) for path in imported["asyncpg"]), imported["asyncpg"]
    for module, files in imported.items():
        if module in FIRST_PARTY or module in sys.stdlib_module_names or module == "__future__":
            continue
        owners = {_normalized(d) for d in distributions.get(module, [module])}
        if not owners & declared:
            missing[module] = sorted(files)
    assert not missing, f"imported but not in [project] dependencies: {missing}"
    # The scan itself sees what it must: direct imports that mcp also pulls in.
    assert {"httpx2", "starlette", "uvicorn", "pydantic"} <= set(
        imported_top_level_modules("gateway", "providers"))


# Used through private names behind one module each (gateway/mcp/sdk_fence.py,
# gateway/store/sqlite/aiosqlite_fence.py, gateway/config/sources.py), which are checked on
# one minor release only.
FENCED_LIBRARIES = ("mcp", "aiosqlite", "pydantic-settings")


@pytest.mark.parametrize("library", FENCED_LIBRARIES)
def test_a_library_used_through_private_names_is_pinned_below_its_next_minor(library: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (pin,) = (Requirement(spec) for spec in project["dependencies"]
              if Requirement(spec).name == library)
    installed = version(library)
    assert pin.specifier.contains(installed)
    major, minor = (int(part) for part in installed.split(".")[:2])
    assert not pin.specifier.contains(f"{major}.{minor + 1}.0"), f"{library}: {pin}"


# A module past this does more than one job: split it by concern (docs/architecture.md,
# Module size). Never compress one to pass: the cap counts concerns, not characters.
MAX_MODULE_LINES = 600


def test_no_module_of_gateway_or_providers_is_over_600_lines() -> None:
    sizes = {path.relative_to(REPO).as_posix(): len(path.read_text().splitlines())
             for package in PRODUCT_PACKAGES for path in (REPO / package).rglob("*.py")}
    assert sizes, "no modules found: the test looks in the wrong place"
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not too_long, (
        f"over {MAX_MODULE_LINES} lines: {too_long}. Split each by concern into modules of one "
        f"job each, named for it. Never compress a module to pass the cap: no squeezed "
        f"docstrings or comments, no folded branches, no one-line helpers inlined "
        f"(docs/architecture.md, Module size).")


def test_nothing_outside_the_operator_cli_calls_print() -> None:
    """stdout is the MCP stdio channel: the server, the jobs, the stores and the providers
    log to stderr through structlog. Only gateway/cli/ (the operator's commands, whose
    stdout is their answer) may print."""
    offenders = []
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.is_relative_to(REPO / "gateway" / "cli"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "print"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"print() writes to the protocol channel: {offenders}"
