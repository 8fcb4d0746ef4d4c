"""The suite's two tiers, and the guard that keeps the fast one honest (a pytest plugin,
loaded by tests/conftest.py).

The fast tier, `pytest -m "not slow"`, is the edit-test loop: it must stay seconds, and it
must cover the code that changes most (the job machinery: tests/jobs/unit/). A test is
`slow` when it needs PostgreSQL (tests/conftest.py), lives in SLOW_DIRS or SLOW_FILES, asks
for a fixture of SLOW_FIXTURES, or carries `pytest.mark.slow` itself. Every test that starts
a process or a server must be one of those: a test of the fast tier that starts one fails,
naming what it started. That is checked, not hoped for: an audit hook (PEP 578) sees every
process start and socket bind of this process while a fast test sets up and runs. A
fixture's teardown is not watched: the last test of a worker tears down the session's
servers, whatever its tier.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# The folders whose every test is `slow`: each starts whole gateways (in-process with their
# supervisors, or as processes), real CLIs or MCP clients, or the previous release, at
# seconds a test.
SLOW_DIRS = frozenset({"chaos", "cli", "clients", "dashboard", "jobs", "mcp", "realcli",
                       "upgrade"})
# Folders inside those that are not slow: tests/jobs/unit/ runs the job machinery on the
# memory store with a fake run (no process, no socket), in the fast tier.
FAST_DIRS = frozenset({"jobs/unit", "dashboard/unit"})
# Files of the same kind elsewhere: they build and install the package, run the benchmarks,
# the operator CLI, the README's commands or the fake CLIs as processes, or serve a gateway.
SLOW_FILES = frozenset({"test_bench_smoke.py", "test_docs_readme.py", "test_entry.py",
                        "test_packaging.py", "test_runtime.py", "test_versions.py",
                        "fakes/test_fakes.py", "platform/test_linux.py"})
# Fixtures that start a process or a server for the test that asks for one (the test is
# then slow): tests/conftest.py `children`, the child processes of tests/test_proc.py and
# tests/platform/test_platform.py, the loopback API of tests/providers/test_http_api.py.
SLOW_FIXTURES = frozenset({"children", "sleeper", "zombie", "server"})

# The audit events (docs.python.org, "Audit events table") that start a process or a server.
STARTS_A_PROCESS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty",
                              "os.exec", "os.spawn", "os.system", "pty.spawn"})
STARTS_A_SERVER = frozenset({"socket.bind"})


def slow_by_place(item: pytest.Item) -> bool:
    """Whether the test is slow by its file (SLOW_DIRS less FAST_DIRS, SLOW_FILES) or by a
    fixture it asks for (SLOW_FIXTURES)."""
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    relative = item.path.resolve().relative_to(TESTS_DIR)
    if any(relative.is_relative_to(fast) for fast in FAST_DIRS):
        return False
    return relative.parts[0] in SLOW_DIRS or relative.as_posix() in SLOW_FILES


class StartWatch:
    """What the fast test now setting up or running started, seen by the audit hook."""

    def __init__(self) -> None:
        self.watching = False
        self.started: list[str] = []

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        # Called for every audit event of the process, in every thread: the cheap test first.
        if not self.watching or (event not in STARTS_A_PROCESS and event not in STARTS_A_SERVER):
            return
        what = "a server" if event in STARTS_A_SERVER else "a process"
        self.started.append(f"{what} ({event} {_shown(args)})")

    def watch(self) -> None:
        self.watching, self.started = True, []

    def stop(self) -> list[str]:
        self.watching = False
        return self.started


def _shown(args: tuple[Any, ...]) -> str:
    """The event's first arguments, short: which executable, which address."""
    return ", ".join(repr(arg)[:80] for arg in args[:2])


WATCH = StartWatch()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if slow_by_place(item):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(WATCH.hook)  # for the life of the process: an audit hook cannot be removed


def _guarded(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    if item.get_closest_marker("slow") is not None:
        return (yield)
    WATCH.watch()
    try:
        outcome = yield
    finally:
        started = WATCH.stop()
    if started:
        pytest.fail(f"{item.nodeid} is in the fast tier, yet its {phase} started "
                    f"{'; '.join(dict.fromkeys(started))}. A test that starts a process or a "
                    f"server is `slow`: mark it (pytest.mark.slow; whole files and fixtures are "
                    f"listed in tests/tiers.py).", pytrace=False)
    return outcome


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "run"))
