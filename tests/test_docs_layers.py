"""The layer map of docs/architecture.md and the layers contract hold to the code (#24).

A module added without a line in the map, or a module the map names after it was renamed or
removed, fails here; so does a top-level module of `gateway/` that the import-linter layers
contract does not place (it would be free to import anything).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGES = ("gateway", "providers", "neutral")
# An entry of the map starts at column 0 with its path: a module (`gateway/fs.py`) or a folder
# (`gateway/jobs/run/`), then its description, continued on indented lines.
ENTRY = re.compile(r"^((?:gateway|providers|neutral)(?:/[\w.]+)*/?)\s")
MODULE_TOKEN = re.compile(r"(?<![\w/.])([\w/]+\.py)\b")


def layer_map() -> str:
    """The first fenced block under `## Layers`."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1]
    return section.split("```\n", 2)[1]


def modules_in_map() -> set[str]:
    """Every module the map names, as a path from the repository root."""
    named: set[str] = set()
    folder: str | None = None
    for line in layer_map().splitlines():
        entry = ENTRY.match(line)
        if entry:
            path = entry.group(1)
            folder = path if path.endswith("/") else None
            if path.endswith(".py"):
                named.add(path)
            line = line[entry.end():]
        for token in MODULE_TOKEN.findall(line):
            if token.startswith(tuple(f"{package}/" for package in PACKAGES)):
                named.add(token)  # a full path, whichever entry it is mentioned in
            elif folder is not None:
                named.add(folder + token)
    return named


def is_package_marker(path: Path) -> bool:
    """An `__init__.py` with nothing but a docstring marks a package; it is no module to map."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def modules_in_tree() -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "__pycache__" not in path.parts and not is_package_marker(path)
    }


def test_the_layer_map_names_every_module() -> None:
    missing = sorted(modules_in_tree() - modules_in_map())
    assert not missing, f"add these modules to the layer map of docs/architecture.md: {missing}"


def test_every_module_the_layer_map_names_exists() -> None:
    stale = sorted(modules_in_map() - modules_in_tree())
    assert not stale, f"the layer map of docs/architecture.md names modules that do not exist: {stale}"


def test_the_map_reader_sees_what_a_map_says() -> None:
    # The reader itself, on the map's real shapes: a module entry, a folder entry continued on
    # indented lines, a full path inside a folder's description.
    named = modules_in_map()
    assert {"gateway/runtime.py", "gateway/jobs/run/runner.py", "gateway/jobs/run/trust.py",
            "providers/http/wire.py", "gateway/store/__init__.py"} <= named
    assert not any(name.endswith("/") for name in named)


def test_every_top_level_gateway_module_has_a_place_in_the_layers_contract() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    # The gateway's own layers: a contract with `containers` layers the inside of one package.
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"]
                 if c["type"] == "layers" and "containers" not in c]
    placed = {name.strip() for layer in layers["layers"] for name in layer.split("|")}
    top_level = {
        f"gateway.{path.stem if path.is_file() else path.name}"
        for path in (REPO / "gateway").iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    unplaced = sorted(top_level - placed)
    assert not unplaced, f"place these in the layers contract of pyproject.toml: {unplaced}"
