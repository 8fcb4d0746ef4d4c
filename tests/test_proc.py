"""gateway/proc.py against real processes: identity, zombies, pid reuse, group signals, on
both platform implementations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from gateway import proc
from tests.waiting import scaled, wait_until

DEADLINE_S = scaled(10.0)  # bound on every wait for a process state; never reached when things work
# proc's rules hold over either platform implementation (gateway/platform).
pytestmark = pytest.mark.usefixtures("platform_impl")


def _status(pid: int) -> str | None:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return None


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child in its own process group that sleeps until killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


@pytest.fixture
def zombie() -> Iterator[subprocess.Popen[bytes]]:
    """A child (own group) that has exited but is not reaped yet: a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    wait_until(lambda: _status(child.pid) == psutil.STATUS_ZOMBIE, "the child to exit")
    yield child
    child.wait()


def test_the_gateway_itself_is_alive_with_its_own_start_time() -> None:
    started_at = proc.process_start_time(os.getpid())
    assert started_at is not None
    assert proc.is_process_alive(os.getpid(), started_at)


def test_a_zombie_is_not_alive_even_with_the_right_start_time(
    zombie: subprocess.Popen[bytes],
) -> None:
    started_at = psutil.Process(zombie.pid).create_time()
    assert proc.is_process_alive(zombie.pid, started_at) is False


def test_a_reused_pid_with_another_start_time_is_not_the_job(
    sleeper: subprocess.Popen[bytes],
) -> None:
    # Simulates pid reuse: the pid is running, but it is not the process that started when
    # the row says its job's process started.
    started_at = proc.process_start_time(sleeper.pid)
    assert started_at is not None
    assert proc.is_process_alive(sleeper.pid, started_at)
    assert proc.is_process_alive(sleeper.pid, started_at - 3600) is False
    assert proc.is_process_alive(sleeper.pid, started_at + 5) is False


def test_a_reaped_process_is_not_alive_and_has_no_start_time(
    sleeper: subprocess.Popen[bytes],
) -> None:
    started_at = proc.process_start_time(sleeper.pid)
    assert started_at is not None
    sleeper.kill()
    sleeper.wait()
    assert proc.is_process_alive(sleeper.pid, started_at) is False
    assert proc.process_start_time(sleeper.pid) is None


def test_nonsense_pids_are_never_alive() -> None:
    assert proc.is_process_alive(0, time.time()) is False
    assert proc.is_process_alive(-1, time.time()) is False
    assert proc.process_start_time(0) is None


@pytest.mark.slow  # the portable boot id asks `sysctl` (a process)
def test_boot_id_is_stable_and_not_empty() -> None:
    first = proc.boot_id()
    assert first
    assert proc.boot_id() == first


def test_hostname_is_not_empty() -> None:
    assert proc.hostname()


def test_signal_group_reaches_a_running_group_and_reports_a_gone_one(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert proc.group_alive(sleeper.pid)
    assert proc.group_members(sleeper.pid) == [sleeper.pid]
    assert proc.signal_group(sleeper.pid, signal.SIGTERM) is True
    assert sleeper.wait(timeout=DEADLINE_S) == -signal.SIGTERM
    # The group is gone: ESRCH is reported as "not sent", never raised.
    assert proc.signal_group(sleeper.pid, signal.SIGKILL) is False
    assert proc.group_alive(sleeper.pid) is False


def test_a_group_holding_only_a_zombie_is_not_alive(zombie: subprocess.Popen[bytes]) -> None:
    # The kernel still knows the group (its zombie), yet nothing in it runs.
    os.killpg(zombie.pid, 0)
    assert proc.group_alive(zombie.pid) is False
    assert proc.group_members(zombie.pid) == []


def test_signal_group_refuses_the_gateways_own_group_and_pgid_zero() -> None:
    # If these were sent, this test process would die with SIGTERM.
    assert proc.signal_group(0, signal.SIGTERM) is False
    assert proc.signal_group(os.getpgrp(), signal.SIGTERM) is False
    assert proc.signal_group(1, signal.SIGTERM) is False
    assert proc.group_members(os.getpgrp()) == []


def test_signal_name_names_known_signals() -> None:
    assert proc.signal_name(signal.SIGKILL) == "SIGKILL"
    assert proc.signal_name(9999) == "9999"


def test_lower_priority_nices_a_group_relative_to_the_gateway(
    sleeper: subprocess.Popen[bytes],
) -> None:
    expected = min(proc.MAX_NICE, os.nice(0) + 5)
    wait_until(lambda: proc.lower_priority(sleeper.pid, 5), "the kernel to accept it")
    assert psutil.Process(sleeper.pid).nice() == expected
    own_group = proc.autogroup_nice(os.getpid())
    if own_group is not None:  # its own session, so its own autogroup on Linux
        assert proc.autogroup_nice(sleeper.pid) == min(proc.MAX_NICE, own_group + 5)


def test_lower_priority_of_a_gone_process_or_of_our_own_group_is_a_quiet_no_op(
    zombie: subprocess.Popen[bytes],
) -> None:
    own = os.nice(0)
    zombie.wait()
    assert proc.lower_priority(zombie.pid, 5)  # nothing left to retry
    assert proc.lower_priority(0, 5)  # "my own group"
    assert proc.lower_priority(1, 5)  # init's
    assert proc.lower_priority(os.getpgrp(), 5)
    assert os.nice(0) == own  # the gateway's own priority is untouched
