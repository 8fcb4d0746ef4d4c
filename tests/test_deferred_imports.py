"""Every import inside a function says why it is not at the top of its module (#43 item 6).

The top of a module is where a reader looks for what it needs; an import inside a function
is there for a reason the reader cannot see, so its line names it: `# deferred: <reason>`,
one of REASONS (docs/architecture.md, "Deferred imports"). An import deferred for no reason
belongs at the top, and a marker left on a top-level import is stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "providers", "neutral")
MARKER = "# deferred: "
# start-up: a start someone waits for (the CLI's commands, serve's first answers, a forked
# supervisor) does not load it; optional dependency: an extra that may be missing (asyncpg);
# platform: a module some OS lacks (fcntl on native Windows).
REASONS = ("start-up", "optional dependency", "platform")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
IMPORTS = (ast.Import, ast.ImportFrom)


def reason_of(line: str) -> str | None:
    """The reason a `# deferred: <reason> (why)` comment names, or None without one."""
    _, marker, rest = line.partition(MARKER)
    return rest.split(" (", 1)[0].strip() if marker else None


def import_lines(path: Path) -> tuple[list[int], list[int]]:
    """(first lines of the imports inside functions, first lines of the other imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    inside = {node.lineno for function in ast.walk(tree) if isinstance(function, FUNCTIONS)
              for node in ast.walk(function) if isinstance(node, IMPORTS)}
    every = {node.lineno for node in ast.walk(tree) if isinstance(node, IMPORTS)}
    return sorted(inside), sorted(every - inside)


def product_modules() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]


def test_every_import_inside_a_function_names_why_it_is_deferred() -> None:
    unmarked, unknown, deferred = [], [], 0
    for path in product_modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        inside, _ = import_lines(path)
        for lineno in inside:
            where = f"{path.relative_to(REPO)}:{lineno}: {lines[lineno - 1].strip()}"
            reason = reason_of(lines[lineno - 1])
            if reason is None:
                unmarked.append(where)
            elif reason not in REASONS:
                unknown.append(where)
            deferred += 1
    assert deferred, "no import inside a function found: the test looks in the wrong place"
    assert not unmarked, ("move these to the top of the module, or say why they wait with "
                          f"`{MARKER}<reason>` ({', '.join(REASONS)}): {unmarked}")
    assert not unknown, f"the reason is one of {REASONS}: {unknown}"


def test_no_top_level_import_carries_a_deferred_marker() -> None:
    stale = []
    for path in product_modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        _, top = import_lines(path)
        stale += [f"{path.relative_to(REPO)}:{n}" for n in top if MARKER in lines[n - 1]]
    assert not stale, f"imported at the top: the marker is stale: {stale}"


def test_the_marker_names_its_reason_before_the_why() -> None:
    assert reason_of("import fcntl  # deferred: platform (native Windows lacks it)") == "platform"
    assert reason_of("import x  # noqa: F401  # deferred: optional dependency") == (
        "optional dependency")
    assert reason_of("import x  # here: only a serving gateway needs it") is None
