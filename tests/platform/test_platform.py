"""gateway/platform: the choice, and both implementations against real processes.

Both implementations must give the same answers about the same process (start time, zombie
or not, group members), since a gateway and its supervisors, and two gateways, compare them.
The kqueue exit watch cannot run on Linux: it gets a stand-in `select` module here, which
checks what is registered and that a failed registration falls back to the caller's poll.
Without kqueue (Linux) a child's exit watch is a waiting thread's pipe, tested for real.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import platform, proc
from gateway.platform import portable
from tests.children import reap
from tests.waiting import scaled, wait_until

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = scaled(10.0)


@pytest.fixture
def implementation(platform_impl: str) -> platform.Platform:
    return platform.load(platform_impl)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


def test_the_choice_is_auto_by_default_and_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(platform.ENV_VAR, raising=False)
    assert platform.choose() in platform.IMPLEMENTATIONS
    assert platform.choose() == platform.choose("auto") == platform.choose(" AUTO ")
    monkeypatch.setenv(platform.ENV_VAR, "portable")
    assert platform.choose() == platform.PORTABLE
    assert platform.current().NAME == "portable"
    assert platform.describe() == {"implementation": "portable", "os": sys.platform}
    monkeypatch.setenv(platform.ENV_VAR, "unsupported")
    assert platform.choose() == platform.UNSUPPORTED
    assert platform.setup_problem() is not None and "wsl.exe" in str(platform.setup_problem())


def test_an_unknown_platform_name_is_refused_with_the_choices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(platform.ENV_VAR, "windows")
    with pytest.raises(platform.UnknownPlatform, match="auto, linux, portable"):
        platform.choose()
    assert platform.describe()["implementation"] == "invalid"
    problem = platform.setup_problem()
    assert problem is not None and platform.ENV_VAR in problem


def test_both_implementations_agree_on_a_process_and_its_group(sleeper: subprocess.Popen[bytes]
                                                               ) -> None:
    states = {name: platform.load(name).process_state(sleeper.pid)
              for name in platform.IMPLEMENTATIONS if _available(name)}
    starts = [state[0] for state in states.values() if state is not None]
    assert len(starts) == len(states) and all(not s[1] for s in states.values() if s)
    assert max(starts) - min(starts) <= proc.START_TIME_TOLERANCE_S
    for name in states:
        assert platform.load(name).group_members(sleeper.pid) == [sleeper.pid]
        assert platform.load(name).group_members(sleeper.pid, exclude=sleeper.pid) == []


def _available(name: str) -> bool:
    try:
        platform.choose(name)
    except platform.UnknownPlatform:
        return False
    return True


@pytest.mark.slow  # starts a process
def test_a_zombie_is_not_a_member_and_is_known_as_a_zombie(
        implementation: platform.Platform) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        wait_until(lambda: (implementation.process_state(child.pid) or (0, False))[1],
                   "the child to become a zombie")
        assert implementation.group_members(child.pid) == []
        assert not proc.is_process_alive(child.pid, time.time())
    finally:
        child.wait()
    assert implementation.process_state(child.pid) is None  # reaped: no such process


@pytest.mark.slow  # starts a process
def test_a_process_reads_its_own_start_time_as_others_read_it(
        implementation: platform.Platform, platform_impl: str) -> None:
    # The supervisor (`python -I -S`, the implementation imported from supervisor_paths)
    # records own_start_time(); the gateway checks it against process_state.
    code = ("import sys; sys.path[:0] = sys.argv[1:]; import " + platform_impl + " as p; "
            "print(p.own_start_time(), flush=True); sys.stdin.read()")
    paths = platform.supervisor_paths(platform_impl)
    child = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, *paths],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())
        state = implementation.process_state(child.pid)
        assert state is not None and abs(state[0] - own) <= proc.START_TIME_TOLERANCE_S
        assert proc.is_process_alive(child.pid, own)
    finally:
        reap(child, grace_s=DEADLINE_S)  # EOF on its stdin ends it; its stdout closed too


class FakeKqueue:
    def __init__(self, refuse: int | None) -> None:
        self.refuse = refuse
        self.registered: list[Any] = []
        self.closed = False

    def fileno(self) -> int:
        return 42

    def control(self, changes: list[Any], max_events: int, timeout: float) -> list[Any]:
        if self.refuse is not None:
            raise OSError(self.refuse, os.strerror(self.refuse))
        self.registered.extend(changes)
        return []

    def close(self) -> None:
        self.closed = True


class FakeSelect:
    """What `select` offers on macOS and the BSDs, for the parts exit_watch uses."""

    KQ_FILTER_PROC = -5
    KQ_EV_ADD = 0x1
    KQ_EV_ONESHOT = 0x10
    KQ_NOTE_EXIT = 0x80000000

    def __init__(self, refuse: int | None = None) -> None:
        self.queues: list[FakeKqueue] = []
        self.refuse = refuse

    def kqueue(self) -> FakeKqueue:
        queue = FakeKqueue(self.refuse)
        self.queues.append(queue)
        return queue

    def kevent(self, ident: int, **fields: int) -> dict[str, int]:
        return {"ident": ident, **fields}


def test_the_kqueue_exit_watch_registers_a_process_exit_filter() -> None:
    fake = FakeSelect()
    watch = portable.exit_watch(1234, selector=fake)
    assert watch is not None and watch.fileno() == 42
    (queue,) = fake.queues
    assert queue.registered == [{
        "ident": 1234, "filter": FakeSelect.KQ_FILTER_PROC,
        "flags": FakeSelect.KQ_EV_ADD | FakeSelect.KQ_EV_ONESHOT,
        "fflags": FakeSelect.KQ_NOTE_EXIT}]
    watch.close()
    assert queue.closed


def test_a_process_gone_before_its_kqueue_filter_leaves_the_poll_to_see_it() -> None:
    fake = FakeSelect(refuse=errno.ESRCH)
    assert portable.exit_watch(1234, selector=fake) is None
    assert fake.queues[0].closed  # nothing leaks


NO_KQUEUE = object()  # a `select` without kqueue: what Linux offers portable.py


def readable(watch: platform.ExitWatch, timeout_s: float) -> bool:
    return bool(select.select([watch], [], [], timeout_s)[0])


def test_without_kqueue_a_child_s_exit_watch_wakes_at_its_exit_and_leaves_it_unreaped(
        sleeper: subprocess.Popen[bytes]) -> None:
    # The supervisor (the CLI's parent) and the gateway (the supervisor's) learn of the exit
    # the moment it happens, without a poll; the one waitpid() that collects it stays theirs.
    watch = portable.exit_watch(sleeper.pid, selector=NO_KQUEUE)
    assert watch is not None
    try:
        assert not readable(watch, 0.0)
        sleeper.kill()
        assert readable(watch, DEADLINE_S)
        pid, status = os.waitpid(sleeper.pid, 0)  # still ours to reap
        assert pid == sleeper.pid and os.waitstatus_to_exitcode(status) == -signal.SIGKILL
        sleeper.returncode = -signal.SIGKILL
    finally:
        watch.close()


def test_without_kqueue_a_watch_in_the_main_thread_starts_no_thread_and_ignores_other_children(
        sleeper: subprocess.Popen[bytes]) -> None:
    # The supervisor's case: single-threaded, so SIGCHLD tells it, with no thread started
    # beside a CLI that is starting up; another child's exit is no wake-up, and closing
    # the watch puts back the handler it replaced.
    before = signal.getsignal(signal.SIGCHLD)
    threads = set(threading.enumerate())
    watch = portable.exit_watch(sleeper.pid, selector=NO_KQUEUE)
    assert watch is not None
    try:
        assert set(threading.enumerate()) == threads
        other = subprocess.Popen([sys.executable, "-c", "pass"])
        wait_until(lambda: portable._child_exited(other.pid), "the other child to exit")
        assert not readable(watch, 0.2)  # its SIGCHLD came and was drained again
        other.wait()
        sleeper.kill()
        assert readable(watch, DEADLINE_S)
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGCHLD) == before


def test_without_kqueue_an_exit_watch_closed_first_ends_its_thread_at_the_exit(
        sleeper: subprocess.Popen[bytes]) -> None:
    # Outside the main thread (no signal handler can be set there) a thread waits. The
    # caller closes a watch it no longer needs: the waiting thread's late write must fail
    # quietly and the thread end.
    made: list[Any] = []
    opener = threading.Thread(
        target=lambda: made.append(portable.exit_watch(sleeper.pid, selector=NO_KQUEUE)))
    opener.start()
    opener.join(DEADLINE_S)
    watch = made[0]
    assert watch is not None
    assert any(t.name == f"exit-watch-{sleeper.pid}" for t in threading.enumerate())
    watch.close()
    watch.close()  # idempotent
    sleeper.kill()
    sleeper.wait(DEADLINE_S)
    wait_until(lambda: not any(t.name == f"exit-watch-{sleeper.pid}"
                               for t in threading.enumerate()), "the watch's thread to end")


def test_without_kqueue_a_process_that_is_not_our_child_is_left_to_the_caller_s_poll() -> None:
    assert portable.exit_watch(os.getpid(), selector=NO_KQUEUE) is None
    assert portable.exit_watch(os.getppid(), selector=NO_KQUEUE) is None


@pytest.mark.slow  # starts a process
@pytest.mark.usefixtures("platform_impl")
def test_doctor_json_reports_the_platform(tmp_path: Path, platform_impl: str) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("AGENT_GATEWAY_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "gateway", "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=scaled(60), cwd=tmp_path)
    report = json.loads(done.stdout)
    assert report["platform"] == {"implementation": platform_impl, "os": sys.platform}


@pytest.mark.slow  # starts a process
def test_the_linux_implementation_imports_nothing_but_the_stdlib() -> None:
    # A supervisor imports it under `python -I -S` from the platform folder alone.
    code = ("import sys; sys.path.append(sys.argv[1]); import linux; "
            "print([m for m in sys.modules if m.split('.')[0] in "
            "('gateway', 'providers', 'psutil', 'structlog', 'pydantic')])")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(platform.PLATFORM_DIR)],
                         capture_output=True, text=True, check=True, timeout=DEADLINE_S)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # starts a process
def test_a_detached_process_leads_a_session_and_group_of_its_own(
        implementation: platform.Platform) -> None:
    # A supervisor's pid is its run's pgid (the runner records pgid = pid), and a stop sent
    # to the gateway's group or terminal never reaches it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             **implementation.detach_kwargs())
    try:
        assert os.getpgid(child.pid) == os.getsid(child.pid) == child.pid
        assert os.getsid(child.pid) != os.getsid(0)
    finally:
        child.kill()
        child.wait(DEADLINE_S)


@pytest.mark.slow  # starts a process
def test_a_detached_fork_has_left_our_session_before_it_runs_anything(
        implementation: platform.Platform) -> None:
    read_fd, write_fd = os.pipe()
    try:
        if implementation.fork_detached():  # the child: report, then leave at once
            try:
                os.write(write_fd, f"{os.getpid()} {os.getsid(0)} {os.getpgrp()}".encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        write_fd = -1
        with os.fdopen(read_fd, "rb") as fh:
            read_fd = -1
            pid, sid, pgid = (int(field) for field in fh.read().split())
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
    os.waitpid(pid, 0)
    assert sid == pgid == pid and sid != os.getsid(0)


PROCFS_OR_PIDFD = re.compile(r"(?<![\w.])/proc\b(?!\.py)|pidfd")


def test_only_the_linux_implementation_names_procfs_or_pidfd() -> None:
    """Issue 21: the platform facts have one home; no other module of the product reads
    procfs or opens a process fd, or branches on them (a comment naming them is how a
    second home starts)."""
    repo = Path(platform.__file__).resolve().parents[2]
    linux = repo / "gateway" / "platform" / "linux.py"
    named = [str(path.relative_to(repo))
             for package in ("gateway", "providers") for path in sorted((repo / package).rglob("*.py"))
             if path != linux and PROCFS_OR_PIDFD.search(path.read_text(encoding="utf-8"))]
    assert named == []
