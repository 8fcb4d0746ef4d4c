"""Where each provider CLI is installed and which version it is, probed in the background.

`gateway_status` reports this, but must never spawn anything on the request path: a hung
`--version` (a node CLI that wants to update itself, a login prompt) would hang the tool.
So the lifespan starts `probe_all()` once the gateway is up; each probe is an argv list
(never a shell), runs in its own process group with the same scrubbed environment as a
provider run (gateway/childenv.py), and the group is killed when it overruns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from gateway import proc
from gateway.childenv import child_env, secret_env_names
from gateway.config import Settings
from providers.registry import provider_binary

log = structlog.get_logger(__name__)

VERSION_PROBE_TIMEOUT_S = 5.0  # a node CLI answers --version in ~1 s; a hung one is killed
VERSION_PROBE_PARALLEL = 3  # seven probes at once would compete with startup on 2 cores
VERSION_LINE_MAX = 120  # a banner is cut to one short line
PROBE_REAP_S = 1.0  # after SIGKILL the probe's exit is collected at once; bound it anyway


@dataclass(slots=True)
class CliInfo:
    provider: str
    enabled: bool
    command: str | None  # configured command, if any
    path: str | None  # where it was found (None: not found)
    version: str | None = None
    version_error: str | None = None
    probed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "found": self.path is not None, "path": self.path,
                "configured_command": self.command, "version": self.version,
                "version_error": self.version_error,
                "version_probed": self.probed}


class CliVersions:
    """A cache of CLI locations and versions, filled once in the background."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._info: dict[str, CliInfo] = {}
        self.finished = asyncio.Event()
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Ask a running probe_all to kill its probes and return (shutdown). Preferred over
        cancelling it: a probe cancelled mid-spawn would leave a child nobody reaps."""
        self._stopping.set()

    def locate(self, provider: str) -> CliInfo:
        """Where the provider's CLI is (a PATH scan: stat calls only, no process)."""
        config = self.settings.providers[provider]
        cached = self._info.get(provider)
        if cached is not None:
            return cached
        try:
            path = provider_binary(provider, config.command, os.environ.get("PATH", ""))
        except Exception as exc:
            return CliInfo(provider, config.enabled, config.command, None,
                           version_error=f"lookup failed: {exc}")
        return CliInfo(provider, config.enabled, config.command, path)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every CLI provider: found where, which version (None until probed)."""
        return {name: self.locate(name).as_dict() for name in self.settings.providers}

    async def probe_all(self) -> None:
        """Probe every enabled, installed CLI's `--version`, a few at a time."""
        gate = asyncio.Semaphore(VERSION_PROBE_PARALLEL)

        async def one(name: str) -> None:
            info = self.locate(name)
            if info.enabled and info.path is not None:
                async with gate:
                    if self._stopping.is_set():
                        return
                    info.version, info.version_error = await probe_version(
                        info.path, secret_env_names(self.settings), self._stopping)
                info.probed = True
            self._info[name] = info

        try:
            await asyncio.gather(*(one(name) for name in self.settings.providers))
        finally:
            self.finished.set()
        log.debug("provider CLI versions probed", action="probe_versions",
                  versions={n: i.version for n, i in self._info.items()})


async def probe_version(executable: str, secret_env: Iterable[str],
                        stopping: asyncio.Event | None = None) -> tuple[str | None, str | None]:
    """(first line of `<executable> --version`, None) or (None, why it failed). Gives up
    (killing the probe's process group) after VERSION_PROBE_TIMEOUT_S or once `stopping`
    is set. `secret_env`: as a provider run's (gateway.childenv.secret_env_names)."""
    env = await asyncio.to_thread(child_env, secret_env)  # scans the user bin dirs
    try:
        probe = await asyncio.create_subprocess_exec(
            executable, "--version", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, env=env)
    except OSError as exc:
        return None, f"cannot run: {exc.strerror or exc}"
    talk = asyncio.ensure_future(probe.communicate())
    stop = asyncio.ensure_future((stopping or asyncio.Event()).wait())
    try:
        await asyncio.wait({talk, stop}, timeout=VERSION_PROBE_TIMEOUT_S,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not talk.done():
            # start_new_session: the probe's pid is its group's id. The group, so that a
            # wrapper script's child dies too.
            proc.signal_group(probe.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(talk, PROBE_REAP_S)
    if talk.cancelled() or talk.exception() is not None:
        return None, "`--version` probe was interrupted"
    if probe.returncode is not None and probe.returncode < 0:
        return None, f"`--version` did not answer within {VERSION_PROBE_TIMEOUT_S:g} s"
    stdout, stderr = talk.result()
    line = _first_line(stdout) or _first_line(stderr)
    if probe.returncode != 0:
        return None, f"`--version` exited {probe.returncode}: {line or 'no output'}"
    return line, None if line else "`--version` printed nothing"


def _first_line(data: bytes) -> str | None:
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if line:
            return line[:VERSION_LINE_MAX]
    return None
