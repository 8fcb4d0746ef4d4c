"""`<cli> --version` probes (gateway/versions.py) against real processes: a probe that does
not answer is stopped with its whole process group, so a wrapper's child cannot outlive it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import anyio
import pytest

from gateway import proc
from gateway.versions import probe_version
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

DEADLINE_S = 15.0  # bound on every wait here; never reached when things work


def hanging_cli(tmp_path: Path) -> tuple[Path, Path]:
    """A CLI whose --version forks a child that ignores SIGTERM, publishes its pid, and hangs."""
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "hanging-cli"
    script.write_text(f"""#!{sys.executable} -S
import os, signal, time
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open({str(pid_file)!r} + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace({str(pid_file)!r} + ".tmp", {str(pid_file)!r})
    time.sleep(120)
time.sleep(120)
""")
    script.chmod(0o755)
    return script, pid_file


async def test_a_stopped_probe_kills_its_whole_process_group(tmp_path: Path) -> None:
    script, pid_file = hanging_cli(tmp_path)
    stopping = asyncio.Event()
    with anyio.fail_after(scaled(DEADLINE_S)):
        probe = asyncio.create_task(probe_version(str(script), frozenset(), stopping))
        while not pid_file.exists():
            await anyio.sleep(0.02)
        child = int(pid_file.read_text())
        pgid = os.getpgid(child)
        assert pgid != os.getpgrp()  # its own group, apart from ours
        stopping.set()
        version, problem = await probe
        assert version is None and problem
        while proc.group_alive(pgid):  # SIGKILL reaches the child that ignores SIGTERM
            await anyio.sleep(0.02)
