"""Several "hosts" on one machine for the worker tests (issue 42): each gateway or worker
runs in a UTS namespace of its own (`unshare --uts`, its own hostname), with its own HOME,
its own config and a PATH that holds only its own set of fake provider CLIs, all on one
throwaway PostgreSQL database.

The hostname is set by a few lines of Python before it execs the gateway: no shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from mcp import Client, StdioServerParameters

from gateway.config import Settings, load_settings
from gateway.store import open_store
from gateway.store.base import JobStore

REPO = Path(__file__).resolve().parents[2]
FAKES_BIN = REPO / "tests" / "fakes" / "bin"
FAKE_COMMAND = {"claude": "claude", "codex": "codex", "gemini": "agy", "grok": "grok",
                "mistral": "vibe", "devin": "devin", "cursor": "cursor-agent"}
FAST_LEASE = {"heartbeat_s": 0.2, "ttl_s": 1.0, "http_job_grace_s": 1.0,
              "sweep_interval_s": 0.2, "instance_gc_s": 1.0, "cancel_poll_s": 0.2,
              "drain_timeout_s": 1.5}
CLIENT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# Runs in the new namespace: set its hostname, then become the command (argv[2:]).
SET_HOSTNAME_AND_EXEC = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
                         "os.execv(sys.argv[2], sys.argv[2:])")


def namespaces_available() -> bool:
    """Whether this process may make a UTS namespace (root, or a user namespace allowed)."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def need_namespaces() -> None:
    if not namespaces_available():
        pytest.skip("`unshare --uts` is not allowed here (needs root or user namespaces)")


class Host:
    """One "machine": a hostname, a HOME, a bin dir of the fake CLIs it has, a config."""

    def __init__(self, root: Path, name: str, dsn: str, providers: tuple[str, ...],
                 logged_in: tuple[str, ...] | None = None, **config: Any) -> None:
        self.name = name
        self.root = root / name
        self.home = self.root / "home"
        self.bin = self.root / "bin"
        self.home.mkdir(parents=True)
        self.bin.mkdir()
        self.dsn = dsn
        self.log = self.root / "fake-cli.log"
        self.stderr_path = self.root / "stderr.log"
        for provider in providers:  # a wrapper, not a link: a fake finds its module by its path
            wrapper = self.bin / FAKE_COMMAND[provider]
            wrapper.write_text(f"#!/bin/sh\nexec '{FAKES_BIN / FAKE_COMMAND[provider]}' \"$@\"\n")
            wrapper.chmod(0o755)
        for provider in logged_in if logged_in is not None else providers:
            if provider == "codex":  # what `codex login status` reads (the fake does too)
                (self.home / ".codex").mkdir()
                (self.home / ".codex" / "auth.json").write_text("{}")
        base: dict[str, Any] = {
            "persistence": {"backend": "postgres", "dsn": dsn},
            "lease": dict(FAST_LEASE),
            "limits": {"kill_grace_s": 1.0},
            "worker": {"accept_remote": True, "claim_poll_s": 0.1},
        }
        for section, values in config.items():
            base[section] = {**base.get(section, {}), **values}
        self.config = self.root / "config.toml"
        self.config.write_text(tomli_w.dumps(base))
        self.config.chmod(0o600)
        self.process: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """This host's environment: nothing of the test machine's PATH but the system dirs
        (the fakes' `env python3`), so only its own fakes are found."""
        return {
            "HOME": str(self.home),
            "PATH": os.pathsep.join([str(self.bin), "/usr/bin", "/bin"]),
            "AGENT_GATEWAY_CONFIG": str(self.config),
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "FAKE_CLI_LOG": str(self.log),
        }

    def argv(self, *command: str) -> list[str]:
        """`python -m gateway COMMAND...` in a UTS namespace named after this host."""
        return ["unshare", "--uts", sys.executable, "-c", SET_HOSTNAME_AND_EXEC, self.name,
                sys.executable, "-m", "gateway", *command]

    def start_worker(self, *args: str) -> None:
        with self.stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                self.argv("worker", *args), env=self.env(), cwd=self.home,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                start_new_session=True)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def stop(self) -> None:
        """SIGTERM (the worker detaches), then SIGKILL if it does not leave in time."""
        if self.process is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
        self.process = None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def spawns(self) -> list[dict[str, Any]]:
        """The runs of fake CLIs on this host (their spawn log lines)."""
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [line for line in lines if "prompt" in line]

    @contextlib.asynccontextmanager
    async def client(self, mode: str = "legacy") -> AsyncIterator[Client]:
        """An MCP client of this host's gateway (`python -m gateway` over stdio)."""
        params = StdioServerParameters(command="unshare", args=self.argv()[1:],
                                       env=self.env(), cwd=str(self.home))
        async with Client(params, mode=mode, read_timeout_seconds=CLIENT_TIMEOUT_S) as client:
            yield client


def settings_for(dsn: str, tmp: Path) -> Settings:
    config = tmp / "observer.toml"
    config.write_text("")
    return load_settings(config, persistence={"backend": "postgres", "dsn": dsn},
                         lease=dict(FAST_LEASE))


@contextlib.asynccontextmanager
async def observer(dsn: str, tmp: Path) -> AsyncIterator[JobStore]:
    """A store connection of the test's own, to watch the rows (no gateway)."""
    store = await open_store(settings_for(dsn, tmp))
    try:
        yield store
    finally:
        await store.close()


def structured(result: Any) -> dict[str, Any]:
    data = result.structured_content
    assert isinstance(data, dict), result
    return data
