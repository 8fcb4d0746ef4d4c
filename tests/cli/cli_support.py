"""Helpers of the operator CLI tests: the real console entry (`python -m gateway ...`) as
a subprocess, against a real store (a SQLite file or a fresh PostgreSQL database), with the
fake provider CLIs configured by absolute path. HOME is a private directory and PATH holds
only this interpreter's directory and the system dirs: nothing the host has installed is
found, nothing of the developer's config is read."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio

from gateway.config import Settings, load_settings
from tests.waiting import scaled

FAKES_BIN = Path(__file__).resolve().parents[1] / "fakes" / "bin"
FAKE_COMMANDS = {
    "claude": "claude", "codex": "codex", "gemini": "agy", "grok": "grok",
    "mistral": "vibe", "devin": "devin", "cursor": "cursor-agent",
}
CLI_TIMEOUT_S = scaled(60)  # a cold interpreter on a busy 2-core box; a hang fails instead of blocking
T = TypeVar("T")


def hermetic_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every CLI run: no AGENT_GATEWAY_* of the developer's, a private
    HOME, PATH = this Python's directory (for the fakes' `env python3`) + system dirs."""
    base = {k: v for k, v in os.environ.items()
            if not k.upper().startswith(("AGENT_GATEWAY_", "NO_COLOR", "COLUMNS"))}
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    return {**base, "HOME": str(home), "PATH": path, **(extra or {})}


@dataclass
class Cli:
    """One store and a config pointing at it, plus a way to run the console entry."""

    home: Path
    config: Path
    backend: str

    @property
    def settings(self) -> Settings:
        return load_settings(self.config)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gateway", *args, "--config", str(self.config)]

    def run(self, *args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=hermetic_env(self.home, env),
                              cwd=self.home, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), env=hermetic_env(self.home, env),
                                cwd=self.home, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def on_a_terminal(self, *args: str, env: dict[str, str] | None = None
                      ) -> subprocess.CompletedProcess[bytes]:
        """The command with its stdout on a real pty: what it wrote there (the line
        discipline's "\\r\\n" back to "\\n"), its stderr and its exit code."""
        master, slave = pty.openpty()
        try:
            child = subprocess.Popen(self.argv(*args), stdin=subprocess.DEVNULL, stdout=slave,
                                     stderr=subprocess.PIPE, env=hermetic_env(self.home, env),
                                     cwd=self.home)
            os.close(slave)
            chunks = []
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            _out, err = child.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            os.close(master)
        written = b"".join(chunks).replace(b"\r\n", b"\n")
        return subprocess.CompletedProcess(child.args, child.returncode, written, err)

    def in_store(self, action: Callable[[Any], Awaitable[T]]) -> T:
        from gateway.store import open_store

        async def run() -> T:
            store = await open_store(self.settings)
            try:
                return await action(store)
            finally:
                await store.close()

        return anyio.run(run)


def write_config(home: Path, persistence: str) -> Path:
    commands = "".join(f'[providers.{name}]\ncommand = "{FAKES_BIN / binary}"\n'
                       for name, binary in FAKE_COMMANDS.items())
    path = home / "gw.toml"
    path.write_text(f"{persistence}\n[lease]\ndrain_timeout_s = 5\n{commands}")
    path.chmod(0o600)
    return path
