"""A dashboard to drive in a browser: a SQLite store shared by real gateways (in this
process, running the fake CLIs), the `dashboard` command as a real process on loopback, and
headless Chromium, the system's own (Debian's `chromium`), driven by Playwright.

Shared by the browser tests, bench/dashboard_screenshots.py and bench/bench_dashboard.py.
Nothing from the host's PATH reaches the gateways' CLIs: every provider is configured by
the absolute path of its fake.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import tomli_w
from playwright.async_api import Browser, async_playwright

from gateway.config import Settings, load_settings
from gateway.runtime import Gateway
from tests.children import reap
from tests.cli.cli_support import FAKE_COMMANDS, FAKES_BIN, hermetic_env
from tests.waiting import scaled

START_BOUND_S = 60.0  # a cold interpreter on a loaded 2-core box prints its address by then
# What the browser needs on a machine with no network and no GPU, run as root: no sandbox
# (root), nothing fetched in the background (every such connection is refused here).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage")
ADDRESS = re.compile(r"Dashboard: (http://\S+)")
# Leases of a test's gateways: a cancel seen within a fifth of a second.
LEASE = {"cancel_poll_s": 0.2}


class NoBrowser(RuntimeError):
    """No system Chromium to drive (install Debian's `chromium`; `.ci/run` does)."""


def chromium_executable() -> str:
    """The system's Chromium: $CHROMIUM, else `chromium` on PATH. A test tool's own
    browser download is never used (it cannot be fetched here, and CI must test the one it
    installed)."""
    found = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if not found:
        raise NoBrowser("no `chromium` on PATH: install Debian's chromium package "
                        "(`.ci/run` does) or set CHROMIUM to its path")
    return found


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    executable = chromium_executable()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, headless=True,
                                                   args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Site:
    """One store, its config file, the gateways on it and the dashboard processes."""

    root: Path
    extra: dict[str, Any] = field(default_factory=dict)
    gateways: list[Gateway] = field(default_factory=list)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    def write_config(self) -> Settings:
        self.home.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {
            "persistence": {"backend": "sqlite", "path": str(self.root / "state" / "jobs.db")},
            "lease": dict(LEASE),
            "limits": {"kill_grace_s": 1.0},
            "providers": {name: {"command": str(FAKES_BIN / binary)}
                          for name, binary in FAKE_COMMANDS.items()},
            **self.extra,
        }
        self.config.write_text(tomli_w.dumps(data))
        return self.settings

    @property
    def settings(self) -> Settings:
        return load_settings(self.config)

    async def start_gateway(self) -> Gateway:
        gateway = Gateway(self.settings, role="stdio")
        with anyio.fail_after(scaled(START_BOUND_S)):
            await gateway.start()
        self.gateways.append(gateway)
        return gateway

    async def dashboard(self, *flags: str) -> str:
        """Start `agent-cli-gateway dashboard` and return the address it printed."""
        argv = [sys.executable, "-m", "gateway", "dashboard", "--config", str(self.config),
                *flags]
        log = self.root / f"dashboard-{len(self.processes)}.log"  # its stderr: a pipe could fill
        with log.open("w") as stderr:
            process = subprocess.Popen(argv, env=hermetic_env(self.home), cwd=self.home,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=stderr, text=True)
        self.processes.append(process)
        assert process.stdout is not None
        with anyio.fail_after(scaled(START_BOUND_S)):
            while True:
                line = await anyio.to_thread.run_sync(process.stdout.readline,
                                                      abandon_on_cancel=True)
                if not line:
                    raise AssertionError(f"the dashboard exited: {process.wait()}")
                found = ADDRESS.search(line)
                if found:
                    return found.group(1)

    async def close(self) -> None:
        for process in self.processes:
            process.terminate()
            reap(process)
        for gateway in reversed(self.gateways):
            with anyio.fail_after(scaled(30)):
                await gateway.stop()


@asynccontextmanager
async def site(root: Path, **extra: Any) -> AsyncIterator[Site]:
    """A site under `root`; HOME points into it meanwhile (the gateways' state dir, and so
    the dashboard's: it reads their spool files)."""
    made = Site(root, extra)
    made.write_config()
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(made.home)
    try:
        yield made
    finally:
        try:
            await made.close()
        finally:
            if before is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = before
