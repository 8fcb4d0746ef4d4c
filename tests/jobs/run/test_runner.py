"""ProcessRun against real processes: process groups, stops, limits, spool files, stdin, env.

Children are the fake provider CLIs (tests/fakes/bin, driven by @directives in the prompt;
their FAKE_CLI_LOG names the grandchildren they fork) or, where a test needs a behaviour the
fakes do not have, small stdlib Python scripts written to tmp files (started with -S so they
start fast; they publish a grandchild's pid through a pid file).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from gateway import proc
from gateway.config import PROVIDER_NICE_DEFAULT
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.record_to_outcome import RunOutcome
from gateway.jobs.run.runner import ZYGOTE, ProcessRun
from gateway.jobs.run.spawned import Spawned
from gateway.jobs.run.spec import RunSpec
from gateway.jobs.run.spool import read_tail
from gateway.model import ErrorKind, GatewayError
from providers.base import Invocation
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

FAKES_BIN = Path(__file__).resolve().parents[2] / "fakes" / "bin"
DEADLINE_S = 15.0  # bound on every wait in these tests; never reached when things work
SHORT_GRACE_S = 0.3  # kill grace for tests that expect the SIGKILL to be needed
LONG_S = 60.0  # a limit that must not be what ends the run

# Imported by every child: helpers to publish a pid and to wait for a file.
PRELUDE = """
import os, signal, sys, time, json
def publish_pid(path):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, path)
def fork_grandchild(pid_file, ignore_term):
    if os.fork() == 0:
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        publish_pid(pid_file)
        time.sleep(60)
        os._exit(0)
"""


# -- helpers ---------------------------------------------------------------------------------


def child(tmp_path: Path, body: str, *args: str, stdin: bytes | None = None,
          env: dict[str, str] | None = None, name: str = "child.py") -> Invocation:
    script = tmp_path / name
    script.write_text(PRELUDE + textwrap.dedent(body))
    return Invocation(argv=[sys.executable, "-S", str(script), *args], env=env or {},
                      stdin=stdin)


def fake_claude(tmp_path: Path, prompt: str, *flags: str) -> Invocation:
    """The fake claude in print mode, the prompt after `--`, logging to tmp/fake-cli.log."""
    return Invocation(argv=[str(FAKES_BIN / "claude"), "--print", *flags, "--", prompt],
                      env={"FAKE_CLI_LOG": str(tmp_path / "fake-cli.log")})


def fake_log(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "fake-cli.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def logged_grandchild(tmp_path: Path) -> tuple[int, float]:
    """The pid (and start time) of the grandchild a fake reported in its log."""
    def pids() -> list[int]:
        return [e["grandchild_pid"] for e in fake_log(tmp_path) if "grandchild_pid" in e]
    await until(lambda: bool(pids()), "the fake to log its grandchild")
    pid = pids()[0]
    started_at = proc.process_start_time(pid)
    assert started_at is not None
    return pid, started_at


def make_spec(tmp_path: Path, invocation: Invocation, **overrides: Any) -> RunSpec:
    values: dict[str, Any] = {
        "job_id": "job-1", "invocation": invocation, "spool_dir": tmp_path / "spool",
        "working_dir": None, "timeout_s": LONG_S, "idle_timeout_s": None,
        "max_output_bytes": 10 * 1024 * 1024, "kill_grace_s": SHORT_GRACE_S,
        "secret_env": frozenset(),
    }
    values.update(overrides)
    values["spool_dir"].mkdir(parents=True, exist_ok=True)  # the manager makes it: made before
    return RunSpec(**values)


async def run_to_end(spec: RunSpec) -> tuple[ProcessRun, RunOutcome]:
    run = ProcessRun(spec)
    with anyio.fail_after(scaled(DEADLINE_S)):
        await run.start()
        return run, await run.wait()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll another process's state (there is no event to await for it), with a deadline."""
    with anyio.fail_after(scaled(DEADLINE_S)):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


async def published_pid(path: Path) -> tuple[int, float]:
    """The pid a child published in `path`, with its start time (to survive pid reuse)."""
    await until(path.exists, f"{path.name} to be written")
    pid = int(path.read_text())
    started_at = proc.process_start_time(pid)
    assert started_at is not None
    return pid, started_at


def running(pid: int, started_at: float) -> bool:
    return proc.is_process_alive(pid, started_at)


def assert_no_zombie_children_of_ours() -> None:
    zombies = [c.pid for c in psutil.Process().children()
               if c.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []


# -- stops kill the whole group ------------------------------------------------------------


async def test_cancel_kills_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    invocation = fake_claude(tmp_path, "@ignore-term @grandchild=60 @sleep=60 work")
    run = ProcessRun(make_spec(tmp_path, invocation))
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        grandchild, started_at = await logged_grandchild(tmp_path)
        assert running(grandchild, started_at)
        run.cancel()
        outcome = await run.wait()
    assert outcome.error_kind == ErrorKind.CANCELLED
    assert outcome.exit_code is None
    assert outcome.signal == 9  # SIGTERM was ignored; only the SIGKILL ended the leader
    assert not running(grandchild, started_at)
    assert not proc.group_alive(identity.pgid)
    assert_no_zombie_children_of_ours()


async def test_sigkill_reaches_the_group_even_after_the_leader_obeyed_sigterm(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    invocation = child(tmp_path, f"""
        fork_grandchild({str(pid_file)!r}, ignore_term=True)
        time.sleep(60)  # the leader dies of the SIGTERM at once
    """)
    run = ProcessRun(make_spec(tmp_path, invocation))
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        grandchild, started_at = await published_pid(pid_file)
        run.cancel()
        outcome = await run.wait()
    assert outcome.signal == 15
    assert outcome.error_kind == ErrorKind.CANCELLED
    assert not running(grandchild, started_at)
    assert not proc.group_alive(identity.pgid)


async def test_processes_left_behind_after_a_normal_exit_are_stopped(tmp_path: Path) -> None:
    # The fake answers at once and exits 0, leaving a grandchild sleeping in its group.
    invocation = fake_claude(tmp_path, "@grandchild=60 hello")
    run, outcome = await run_to_end(make_spec(tmp_path, invocation, kill_grace_s=LONG_S))
    assert outcome.error_kind is None and outcome.exit_code == 0
    assert outcome.stdout_path.read_text() == "fake-claude answer: @grandchild=60 hello\n"
    assert outcome.extra.get("stray_processes") == 1
    grandchild = next(e["grandchild_pid"] for e in fake_log(tmp_path) if "grandchild_pid" in e)
    assert not psutil.pid_exists(grandchild) or (
        psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE)
    assert run.identity is not None and not proc.group_alive(run.identity.pgid)


async def test_the_leader_is_reaped_and_leaves_no_zombie(tmp_path: Path) -> None:
    invocation = child(tmp_path, "print('done')")
    run, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.exit_code == 0
    assert run.identity is not None
    assert run.identity.pid not in {c.pid for c in psutil.Process().children()}
    assert not proc.is_process_alive(run.identity.pid, run.identity.started_at)


async def test_running_children_are_watched_without_a_thread_each(tmp_path: Path) -> None:
    # Python 3.11's asyncio starts one waitpid thread per child; a burst of jobs then pays
    # a thread start per spawn. The runner learns each supervisor's exit from its zygote's
    # one reader thread, on every platform.
    invocation = child(tmp_path, "time.sleep(60)")
    runs = [ProcessRun(make_spec(tmp_path, invocation, job_id=f"job-{i}",
                                 spool_dir=tmp_path / f"spool-{i}")) for i in range(9)]
    with anyio.fail_after(scaled(DEADLINE_S)):
        await runs[0].start()  # the spawn's worker thread exists from here on
        threads_with_one = threading.active_count()
        for run in runs[1:]:
            await run.start()
        threads_with_nine = threading.active_count()
        for run in runs:
            run.cancel(grace_s=0)
        outcomes = [await run.wait() for run in runs]
    assert threads_with_nine - threads_with_one < len(runs) - 1
    assert all(o.error_kind == ErrorKind.CANCELLED for o in outcomes)
    assert_no_zombie_children_of_ours()


async def test_a_start_cancelled_while_the_child_spawns_leaves_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once the fork request is out, the forking goes on after start() is cancelled: the
    # supervisor it forked must be killed and reaped, and its temp cwd removed, once its
    # pid is known. Here the forking is held right after the fork until the cancel is done.
    spawned: list[tuple[int, str]] = []
    release = asyncio.Event()
    real = ProcessRun._fork

    async def held_fork(self: ProcessRun, *args: Any) -> Spawned:
        forked = await real(self, *args)
        # The run's temp cwd, from its spec (the supervisor itself waits in "/").
        run_record = sup.read_record(tmp_path / "spool", sup.RUN_NAME)
        assert run_record is not None and run_record["temp_cwd"]
        spawned.append((forked.pid, str(run_record["cwd"])))
        await release.wait()
        return forked

    monkeypatch.setattr(ProcessRun, "_fork", held_fork)
    run = ProcessRun(make_spec(tmp_path, child(tmp_path, "time.sleep(60)")))
    with anyio.fail_after(scaled(DEADLINE_S)):
        starting = asyncio.create_task(run.start())
        await until(lambda: bool(spawned), "the child to be forked")
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        release.set()
        pid, cwd = spawned[0]
        await until(lambda: not psutil.pid_exists(pid), "the child to be killed and reaped")
        await until(lambda: not Path(cwd).exists(), "its temp cwd to be removed")
    assert run.identity is None


async def test_a_start_cancelled_just_after_the_spawn_returned_kills_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The other order: the forking is done, but start() is cancelled before it resumes,
    # which is no sooner than two loop steps later (the shield's outer future, then the
    # task's wakeup); this test sees the forking's result one step after it, stepping the
    # loop one step at a time.
    handed_over: list[Spawned] = []
    real = ProcessRun._fork

    async def recorded_fork(self: ProcessRun, *args: Any) -> Spawned:
        forked = await real(self, *args)
        handed_over.append(forked)
        return forked

    monkeypatch.setattr(ProcessRun, "_fork", recorded_fork)
    run = ProcessRun(make_spec(tmp_path, child(tmp_path, "time.sleep(60)")))
    with anyio.fail_after(scaled(DEADLINE_S)):
        starting = asyncio.create_task(run.start())
        while not handed_over:
            await asyncio.sleep(0)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        pid = handed_over[0].pid
        await until(lambda: not psutil.pid_exists(pid), "the child to be killed and reaped")
    assert run.identity is None


async def test_a_shutdown_shortens_the_grace_of_a_pending_cancel(tmp_path: Path) -> None:
    invocation = child(tmp_path, """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
    """)
    # The cancel's grace is longer than the test's deadline: only the shutdown's grace of
    # zero lets wait() return in time.
    run = ProcessRun(make_spec(tmp_path, invocation, kill_grace_s=LONG_S))
    with anyio.fail_after(scaled(DEADLINE_S)):
        await run.start()
        await until(lambda: run.stdout_bytes > 0, "the child to be ready")
        run.cancel()
        run.cancel()  # idempotent
        run.cancel(ErrorKind.SHUTDOWN, grace_s=0)
        outcome = await run.wait()
    assert outcome.error_kind == ErrorKind.CANCELLED  # the first reason is the one reported
    assert outcome.signal == 9


async def test_cancel_after_the_end_changes_nothing_and_wait_repeats_the_outcome(
    tmp_path: Path,
) -> None:
    run, outcome = await run_to_end(make_spec(tmp_path, fake_claude(tmp_path, "hi")))
    run.cancel()
    with anyio.fail_after(scaled(DEADLINE_S)):
        again = await run.wait()
    assert again is outcome
    assert again.error_kind is None and again.exit_code == 0


def test_a_run_abandoned_by_its_event_loop_leaves_no_process_behind(tmp_path: Path) -> None:
    # asyncio.run cancels the supervising task on its way out. Only a crash of the whole
    # gateway may leave a group running (a successor can adopt it); a live gateway that
    # drops a run must not leak it.
    invocation = fake_claude(tmp_path, "@ignore-term @grandchild=60 @sleep=60 work")

    async def start_and_leave() -> tuple[int, int, float]:
        run = ProcessRun(make_spec(tmp_path, invocation, kill_grace_s=LONG_S))
        identity = await run.start()
        grandchild, started_at = await logged_grandchild(tmp_path)
        return identity.pgid, grandchild, started_at

    pgid, grandchild, started_at = asyncio.run(start_and_leave())
    deadline = time.monotonic() + DEADLINE_S
    while proc.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not proc.group_alive(pgid)
    assert not running(grandchild, started_at)


async def test_cancel_before_start_spawns_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    invocation = child(tmp_path, f"open({str(marker)!r}, 'w').close()")
    run = ProcessRun(make_spec(tmp_path, invocation))
    run.cancel(ErrorKind.SHUTDOWN)
    with pytest.raises(GatewayError) as caught:
        await run.start()
    assert caught.value.kind == ErrorKind.SHUTDOWN
    assert not marker.exists()


# -- limits ----------------------------------------------------------------------------------


async def test_wall_clock_timeout_stops_the_run_with_124(tmp_path: Path) -> None:
    # It keeps printing, so only the wall clock can end it.
    invocation = fake_claude(tmp_path, "@stream=1000:0.05 long job")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, timeout_s=scaled(3.0),
                                            idle_timeout_s=LONG_S))  # time to print, loaded
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert outcome.exit_code == 124
    assert "timeout_s" in (outcome.error or "")
    assert outcome.stdout_bytes + outcome.stderr_bytes > 0  # progress was flowing


async def test_silence_longer_than_the_idle_timeout_stops_the_run_with_125(
    tmp_path: Path,
) -> None:
    # Five lines with gaps shorter than the idle timeout keep the run alive; the silence
    # after them ends it.
    invocation = child(tmp_path, """
        for n in range(5):
            print(f"step {n}", flush=True)
            time.sleep(0.2)
        time.sleep(60)
    """)
    # The 0.2 s gaps stay under the idle bound on a loaded box too: it is scaled for load.
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, idle_timeout_s=scaled(1.0)))
    assert outcome.error_kind == ErrorKind.IDLE_TIMEOUT
    assert outcome.exit_code == 125
    assert outcome.stdout_path.read_text() == "".join(f"step {n}\n" for n in range(5))


async def test_a_provider_silent_until_exit_is_never_idle_killed(tmp_path: Path) -> None:
    # Silent for 1.5 s before its JSON answer: an idle timeout of 0.3 s would have killed it
    # five times over; idle_timeout_s=None (an at-exit provider) means only the wall clock.
    invocation = fake_claude(tmp_path, "@sleep=1.5 think hard", "--output-format", "json")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, idle_timeout_s=None))
    assert outcome.error_kind is None and outcome.exit_code == 0
    answer = json.loads(outcome.stdout_path.read_text())
    assert answer["result"] == "fake-claude answer: @sleep=1.5 think hard"
    assert outcome.duration_s >= 1.5


async def test_output_past_the_cap_ends_the_run_and_keeps_the_first_bytes(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, """
        line = 0
        while True:
            sys.stdout.write(f"line {line:08d}\\n")
            line += 1
    """)
    cap = 200_000
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, max_output_bytes=cap))
    assert outcome.error_kind == ErrorKind.OUTPUT_LIMIT
    assert outcome.exit_code == 126
    assert outcome.truncated is True
    data = outcome.stdout_path.read_bytes()
    assert len(data) == cap == outcome.stdout_bytes
    expected = "".join(f"line {n:08d}\n" for n in range(cap // 14 + 1)).encode()
    assert data == expected[:cap]
    assert int(outcome.extra["bytes_written"]) > cap  # type: ignore[call-overload]


async def test_output_past_the_cap_from_a_run_that_exits_at_once_is_still_cut(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, """
        sys.stdout.write("x" * 300_000)
        sys.stderr.write("e" * 1000)
    """)
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, max_output_bytes=100_000))
    assert outcome.error_kind == ErrorKind.OUTPUT_LIMIT
    assert outcome.truncated is True
    assert outcome.stdout_bytes == 100_000 and outcome.stderr_bytes == 0
    assert outcome.stdout_path.stat().st_size + outcome.stderr_path.stat().st_size == 100_000


async def test_output_written_during_the_grace_is_kept(tmp_path: Path) -> None:
    # Like Claude flushing ~10 KB after SIGTERM: the fake writes 10 000 bytes, exits 143.
    invocation = fake_claude(tmp_path, "@stderr=ready @late=10000 @sleep=60 job")
    run = ProcessRun(make_spec(tmp_path, invocation, kill_grace_s=LONG_S))
    with anyio.fail_after(scaled(DEADLINE_S)):
        await run.start()
        await until(lambda: run.stderr_bytes > 0, "the fake to be ready")
        run.cancel()
        outcome = await run.wait()
    assert outcome.error_kind == ErrorKind.CANCELLED
    assert outcome.extra["provider_exit_code"] == 143
    assert outcome.stdout_path.read_bytes() == b"L" * 9999 + b"\n"
    assert outcome.stdout_bytes == 10_000


# -- exit codes ------------------------------------------------------------------------------


async def test_a_nonzero_exit_is_a_provider_error_quoting_the_last_stderr_lines(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, """
        sys.stderr.write("warming up\\n" * 10 + "\\nfatal: model not available\\n")
        sys.exit(3)
    """)
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.error_kind == ErrorKind.PROVIDER_ERROR
    assert outcome.exit_code == 3
    assert outcome.error is not None
    assert outcome.error.splitlines()[-1] == "fatal: model not available"
    assert len(outcome.error.splitlines()) <= 3


async def test_a_provider_killed_by_a_foreign_signal_reports_it(tmp_path: Path) -> None:
    invocation = child(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.error_kind == ErrorKind.PROVIDER_ERROR
    assert outcome.signal == 9 and outcome.exit_code == 137
    assert "SIGKILL" in (outcome.error or "")


async def test_wait_returns_after_a_fast_exit_without_sitting_out_grace_or_timeouts(
    tmp_path: Path,
) -> None:
    # Every limit and the grace are longer than the deadline: only learning of the exit from
    # the process itself lets wait() return in time.
    invocation = child(tmp_path, "print('quick')")
    spec = make_spec(tmp_path, invocation, timeout_s=LONG_S, idle_timeout_s=LONG_S,
                     kill_grace_s=LONG_S)
    run, outcome = await run_to_end(spec)
    assert outcome.exit_code == 0 and outcome.error_kind is None
    assert run.finished
    assert outcome.stdout_path.read_text() == "quick\n"
    assert outcome.duration_s < LONG_S


# -- launch ----------------------------------------------------------------------------------


async def test_a_missing_binary_is_not_found_with_the_install_hint(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, Invocation(argv=["no-such-agent-cli-xyz", "--", "hi"]),
                     install_hint="npm install -g no-such-agent-cli-xyz")
    with pytest.raises(GatewayError) as caught:
        await ProcessRun(spec).start()
    assert caught.value.kind == ErrorKind.NOT_FOUND
    message = caught.value.message
    assert "'no-such-agent-cli-xyz' command was not found" in message
    assert "npm install -g no-such-agent-cli-xyz" in message
    assert "PATH" in message


async def test_a_nonexistent_working_dir_is_invalid_input_and_spawns_nothing(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "spawned"
    invocation = child(tmp_path, f"open({str(marker)!r}, 'w').close()")
    spec = make_spec(tmp_path, invocation, working_dir=str(tmp_path / "missing"))
    with pytest.raises(GatewayError) as caught:
        await ProcessRun(spec).start()
    assert caught.value.kind == ErrorKind.INVALID_INPUT
    assert "missing" in caught.value.message
    assert not marker.exists()
    assert not any((tmp_path / "spool").iterdir())  # no spec written for a supervisor


async def test_a_working_dir_that_is_a_file_is_invalid_input(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    spec = make_spec(tmp_path, child(tmp_path, "pass"), working_dir=str(a_file))
    with pytest.raises(GatewayError) as caught:
        await ProcessRun(spec).start()
    assert caught.value.kind == ErrorKind.INVALID_INPUT


async def test_a_prompt_that_looks_like_a_flag_reaches_the_child_as_text(
    tmp_path: Path,
) -> None:
    prompt = "--dangerously-skip-permissions; rm -rf / $(whoami) `id` *"
    _, outcome = await run_to_end(make_spec(tmp_path, fake_claude(tmp_path, prompt)))
    assert outcome.error_kind is None  # an unknown flag would have made the fake exit 2
    [spawn] = [e for e in fake_log(tmp_path) if "argv" in e]
    assert spawn["argv"][1:] == ["--print", "--", prompt]
    assert spawn["prompt"] == prompt
    assert outcome.stdout_path.read_text() == f"fake-claude answer: {prompt}\n"


async def test_a_given_working_dir_is_the_childs_cwd(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    invocation = child(tmp_path, "print(os.getcwd())")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation, working_dir=str(workdir)))
    assert outcome.stdout_path.read_text().strip() == str(workdir)
    assert workdir.is_dir()


async def test_without_a_working_dir_the_child_runs_in_a_private_temp_dir_removed_after(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, """
        cwd = os.getcwd()
        print(json.dumps({"cwd": cwd, "mode": os.stat(cwd).st_mode & 0o777}))
    """)
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    seen = json.loads(outcome.stdout_path.read_text())
    assert seen["mode"] == 0o700
    assert Path(seen["cwd"]).parent == Path(tempfile.gettempdir()).resolve()
    assert not Path(seen["cwd"]).exists()


async def test_the_stdin_payload_is_delivered_whole_and_closed(tmp_path: Path) -> None:
    payload = os.urandom(1024 * 1024)  # larger than a pipe buffer: needs several writes
    invocation = child(tmp_path, """
        import hashlib
        data = sys.stdin.buffer.read()  # returns only at EOF: stdin must be closed
        print(len(data), hashlib.sha256(data).hexdigest())
    """, stdin=payload)
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    import hashlib
    assert outcome.error_kind is None
    assert outcome.stdout_path.read_text().split() == [
        str(len(payload)), hashlib.sha256(payload).hexdigest()]


async def test_a_prompt_on_stdin_reaches_codex_exec_which_then_finishes(
    tmp_path: Path,
) -> None:
    # `codex exec -` reads the prompt until EOF and hangs forever on an open stdin.
    invocation = Invocation(argv=[str(FAKES_BIN / "codex"), "exec", "--json", "-"],
                            stdin=b"review this diff")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.error_kind is None
    assert "fake-codex answer: review this diff" in outcome.stdout_path.read_text()


async def test_without_a_payload_stdin_is_empty(tmp_path: Path) -> None:
    invocation = child(tmp_path, "print(repr(sys.stdin.read()))")
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.stdout_path.read_text() == "''\n"


async def test_a_provider_that_exits_0_without_reading_its_stdin_is_a_failed_launch(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, "print('ignored my input')", stdin=b"p" * (4 * 1024 * 1024))
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    assert outcome.error_kind == ErrorKind.LAUNCH_FAILED
    assert outcome.exit_code == 126
    assert outcome.extra.get("stdin_incomplete") is True


async def test_the_child_env_has_no_color_dumb_term_extended_path_and_no_gateway_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("AGENT_GATEWAY_HTTP__AUTH_TOKEN", "gateway-secret")
    invocation = child(tmp_path, """
        keys = ("NO_COLOR", "TERM", "PATH", "PROVIDER_FLAG", "AGENT_GATEWAY_HTTP__AUTH_TOKEN")
        print(json.dumps({k: os.environ.get(k) for k in keys}))
    """, env={"PROVIDER_FLAG": "on"})
    _, outcome = await run_to_end(make_spec(tmp_path, invocation))
    seen = json.loads(outcome.stdout_path.read_text())
    assert seen["NO_COLOR"] == "1"
    assert seen["TERM"] == "dumb"
    assert seen["PROVIDER_FLAG"] == "on"
    assert seen["AGENT_GATEWAY_HTTP__AUTH_TOKEN"] is None  # the gateway's secrets stay home
    assert seen["PATH"].split(os.pathsep)[:3] == ["/usr/bin", "/bin", str(home / ".local/bin")]


async def test_a_cli_installed_in_a_user_bin_dir_is_found_with_a_bare_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    node_bin = home / ".nvm" / "versions" / "node" / "v22.1.0" / "bin"
    node_bin.mkdir(parents=True)
    cli = node_bin / "my-agent-cli"
    cli.write_text(f"#!{sys.executable} -S\nprint('found me')\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _, outcome = await run_to_end(make_spec(tmp_path, Invocation(argv=["my-agent-cli"])))
    assert outcome.stdout_path.read_text() == "found me\n"


# -- live counters and spool reads -----------------------------------------------------------


async def test_live_counters_follow_the_spool_files_while_the_run_goes_on(
    tmp_path: Path,
) -> None:
    invocation = child(tmp_path, """
        sys.stdout.write("o" * 1000); sys.stdout.flush()
        sys.stderr.write("e" * 10); sys.stderr.flush()
        time.sleep(60)
    """)
    run = ProcessRun(make_spec(tmp_path, invocation))
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        await until(lambda: (run.stdout_bytes, run.stderr_bytes) == (1000, 10), "the counters")
        assert proc.is_process_alive(identity.pid, identity.started_at)
        # Its own session and process group, apart from the gateway's.
        assert os.getsid(identity.pid) == identity.pid
        assert os.getpgid(identity.pid) == identity.pgid == identity.pid != os.getpgrp()
        assert read_tail(run.stdout_path, 5) == "ooooo"
        run.cancel()
        outcome = await run.wait()
    assert (outcome.stdout_bytes, outcome.stderr_bytes) == (1000, 10)


async def test_the_provider_group_runs_below_the_gateways_priority(tmp_path: Path) -> None:
    # The gateway's event loop (heartbeat, MCP answers) must not be starved by its own
    # providers: the leader, what it starts later, and (autogroup scheduling) its session.
    invocation = child(tmp_path, """
        fork_grandchild(sys.argv[1], False)
        time.sleep(60)
    """, str(tmp_path / "grandchild.pid"))
    run = ProcessRun(make_spec(tmp_path, invocation))
    expected = min(proc.MAX_NICE, os.nice(0) + PROVIDER_NICE_DEFAULT)
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        grandchild, _ = await published_pid(tmp_path / "grandchild.pid")
        assert psutil.Process(identity.pid).nice() == expected
        assert psutil.Process(grandchild).nice() == expected
        own_group = proc.autogroup_nice(os.getpid())
        if own_group is not None:  # Linux with autogroup support
            # Retried while the kernel rate-limits it (EAGAIN without CAP_SYS_ADMIN).
            await until(lambda: proc.autogroup_nice(identity.pid)
                        == min(proc.MAX_NICE, own_group + PROVIDER_NICE_DEFAULT),
                        "the provider's autogroup to be niced")
            assert proc.autogroup_nice(os.getpid()) == own_group  # ours is untouched
        # The zygote is not niced: its forks are on every run's path, and a niced one
        # starved past FORK_ANSWER_TIMEOUT_S at its start on a loaded box (two launches lost).
        assert ZYGOTE.pid is not None and psutil.Process(ZYGOTE.pid).nice() == os.nice(0)
        if own_group is not None:
            assert proc.autogroup_nice(ZYGOTE.pid) == own_group
        run.cancel()
        await run.wait()


@pytest.mark.parametrize("provider_nice", [0, 3])
async def test_the_provider_group_runs_as_many_levels_below_as_limits_provider_nice_says(
        tmp_path: Path, provider_nice: int) -> None:
    """[limits] provider_nice (#45): 0 runs the CLI at the gateway's own priority."""
    invocation = child(tmp_path, "time.sleep(60)")
    run = ProcessRun(make_spec(tmp_path, invocation, provider_nice=provider_nice))
    with anyio.fail_after(DEADLINE_S):
        identity = await run.start()
        # start() returns once the supervisor is forked; it lowers its own priority first
        # thing, before it claims the run and long before it spawns the CLI: waited for.
        target = min(proc.MAX_NICE, os.nice(0) + provider_nice)
        await until(lambda: psutil.Process(identity.pid).nice() == target,
                    "the supervisor to lower its priority")
        own_group = proc.autogroup_nice(os.getpid())
        if own_group is not None:
            await until(lambda: proc.autogroup_nice(identity.pid)
                        == min(proc.MAX_NICE, own_group + provider_nice),
                        "the provider's autogroup to be niced")
        run.cancel()
        await run.wait()
