"""Child processes a test starts, each one reaped where it was started (#24).

Warnings are errors here (pyproject): a `Popen` whose exit nobody collected warns
"subprocess N is still running" when it is garbage-collected, and a pipe nobody closed warns
"unclosed file". Neither points at the test that started the child, and a zombie stays in the
process table until pytest exits. So every child is waited for and its pipes closed, pass or
fail: `reap` at the end of a `try`, or the `children` fixture (tests/conftest.py), which
reaps what it tracked at teardown.

Reaping is not killing: a child is first given `grace_s` to end by itself (a supervisor
that is writing its end record, a gateway draining), and only then is it SIGKILLed, with
its process group when it leads one (start_new_session), so nothing it forked runs on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any, TypeVar

from tests.waiting import scaled

GRACE_S = scaled(20.0)  # a child ending by itself on a loaded box (a supervisor's kill grace, a drain)
KILLED_S = scaled(10.0)  # a SIGKILLed child is gone in milliseconds; the bound only guards a hang

P = TypeVar("P", bound="subprocess.Popen[Any]")


def reap(popen: subprocess.Popen[Any], *, grace_s: float = GRACE_S) -> int:
    """Close the child's pipes and collect its exit: its returncode. A child still running
    after `grace_s` is SIGKILLed first, with its group if it leads one. Idempotent."""
    for stream in (popen.stdin, popen.stdout, popen.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):  # EPIPE: the child had gone already
                stream.close()
    try:
        return popen.wait(grace_s)
    except subprocess.TimeoutExpired:
        kill(popen)
        return popen.wait(KILLED_S)


def kill(popen: subprocess.Popen[Any]) -> None:
    """SIGKILL the child, and its group when it leads one. Only while its exit is not
    collected: after that its pid (and the group id) may name someone else's process."""
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(popen.pid) == popen.pid:
            os.killpg(popen.pid, signal.SIGKILL)
            return
    popen.kill()


class Children:
    """The children of one test (the `children` fixture): `track` each one when it is
    started; all are reaped at the test's end, the last started first."""

    def __init__(self) -> None:
        self._tracked: list[subprocess.Popen[Any]] = []

    def track(self, popen: P) -> P:
        self._tracked.append(popen)
        return popen

    def reap_all(self, *, grace_s: float = GRACE_S) -> None:
        while self._tracked:
            reap(self._tracked.pop(), grace_s=grace_s)
