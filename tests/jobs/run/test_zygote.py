"""The zygote (issue 26): one pre-imported process per gateway forks every run's supervisor,
and neither its death nor its silence loses a run or launches one twice.

Real zygotes, real forked supervisors and small stdlib children (test_runner's helpers).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import psutil
import pytest

from gateway import platform, proc
from gateway.jobs.run import forks, runner, spool
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.runner import ZYGOTE, ProcessRun
from gateway.model import ErrorKind, GatewayError
from tests.children import Children
from tests.jobs.run.test_runner import DEADLINE_S, child, make_spec, until
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

# Prints its argument, then waits for a file before it exits: the test decides when.
WAIT_FOR_GO = """
print(sys.argv[1], flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
"""


def zygote_pid() -> int:
    pid = ZYGOTE.pid
    assert pid is not None, "no zygote lives"
    return pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def waiting_runs(tmp_path: Path, count: int, tag: str) -> tuple[list[ProcessRun], Path]:
    go = tmp_path / f"go-{tag}"
    invocation = child(tmp_path, WAIT_FOR_GO, tag, str(go), name=f"{tag}.py")
    runs = [ProcessRun(make_spec(tmp_path, invocation, job_id=f"{tag}-{i}",
                                 spool_dir=tmp_path / f"spool-{tag}-{i}"))
            for i in range(count)]
    return runs, go


async def test_every_run_s_supervisor_is_forked_by_one_zygote(tmp_path: Path) -> None:
    runs, go = waiting_runs(tmp_path, 6, "burst")
    with anyio.fail_after(scaled(DEADLINE_S)):
        identities = [await run.start() for run in runs]
        zygote = zygote_pid()
        parents = {psutil.Process(identity.pid).ppid() for identity in identities}
        go.touch()
        outcomes = [await run.wait() for run in runs]
    assert parents == {zygote}  # a fork each, not an interpreter each
    assert all(identity.pgid == identity.pid for identity in identities)  # own groups
    assert [o.exit_code for o in outcomes] == [0] * len(runs)
    assert ZYGOTE.pid == zygote  # the same zygote serves on


async def test_runs_outlive_a_killed_zygote_and_the_next_run_gets_a_new_one(
        tmp_path: Path) -> None:
    runs, go = waiting_runs(tmp_path, 3, "orphaned")
    with anyio.fail_after(scaled(DEADLINE_S)):
        identities = [await run.start() for run in runs]
        old = zygote_pid()
        os.kill(old, signal.SIGKILL)
        await until(lambda: gone(old), "the zygote to die")
        assert all(not run.finished for run in runs)  # its supervisors run on
        go.touch()
        outcomes = [await run.wait() for run in runs]  # learned by polling their pids
        (after,), go_after = waiting_runs(tmp_path, 1, "after")
        go_after.touch()
        await after.start()
        outcome_after = await after.wait()
    assert [(o.exit_code, o.error_kind) for o in outcomes] == [(0, None)] * len(runs)
    for run, identity in zip(runs, identities, strict=True):
        assert run.stdout_path.read_text().strip() == "orphaned"
        assert (sup.read_record(run.spec.spool_dir, sup.END_NAME) or {})["pid"] == identity.pid
    assert outcome_after.exit_code == 0
    assert zygote_pid() != old


async def test_a_stopped_zygote_is_replaced_and_its_run_still_runs_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its replacement starts cold and must answer inside this too (under coverage on a busy
    # box a cold zygote took longer than 0.5 s, and the run failed as "stopped answering").
    monkeypatch.setattr(forks, "FORK_ANSWER_TIMEOUT_S", scaled(1.0))
    (first,), go = waiting_runs(tmp_path, 1, "first")
    go.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        await first.start()
        await first.wait()
        stopped = zygote_pid()
        os.kill(stopped, signal.SIGSTOP)
        (unanswered,), go_unanswered = waiting_runs(tmp_path, 1, "unanswered")
        go_unanswered.touch()
        await unanswered.start()
        outcome = await unanswered.wait()
        await until(lambda: gone(stopped), "the stopped zygote to be killed")
    assert (outcome.exit_code, outcome.error_kind) == (0, None)
    assert unanswered.stdout_path.read_text().splitlines() == ["unanswered"]
    assert zygote_pid() != stopped


def lose_answers(monkeypatch: pytest.MonkeyPatch, count: int) -> list[int]:
    """The first `count` forks happen, and once the run is claimed their zygote dies before
    its answer arrives (a real zygote, SIGKILLed): the pids those zygotes forked."""
    forked: list[int] = []
    real = forks.Link.fork

    async def answer_lost(self: forks.Link, run: dict[str, object]) -> int:
        pid = await real(self, run)
        if len(forked) >= count:
            return pid
        forked.append(pid)
        claim = Path(str(run["spool_dir"])) / sup.START_NAME
        await until(claim.exists, "the forked supervisor to claim the run")
        self.kill()  # the zygote dies with the answer
        raise forks.ForkUnanswered

    monkeypatch.setattr(forks.Link, "fork", answer_lost)
    return forked


async def test_a_fork_whose_answer_was_lost_runs_once_under_the_supervisor_that_claimed_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygote forked the run and died before its answer arrived: the run goes to a new
    # zygote with the same token, both supervisors race for the one claim, and the gateway
    # watches the winner, whichever it is. Here the first one holds the claim for sure: its
    # CLI is already running when the second is asked for.
    first_pids = lose_answers(monkeypatch, 1)
    (run,), go = waiting_runs(tmp_path, 1, "lost")
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        go.touch()
        outcome = await run.wait()
    assert first_pids and identity.pid == first_pids[0]  # the claimant is watched
    assert (outcome.exit_code, outcome.error_kind) == (0, None)
    assert run.stdout_path.read_text().splitlines() == ["lost"]  # it ran once


async def test_a_run_ends_while_its_zygote_is_stopped(tmp_path: Path) -> None:
    # A stopped zygote reaps nothing and reports nothing: the run's end is read from the
    # process table after a grace, with the outcome of its end record.
    (run,), go = waiting_runs(tmp_path, 1, "unreported")
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        stopped = zygote_pid()
        os.kill(stopped, signal.SIGSTOP)
        try:
            go.touch()
            outcome = await run.wait()
            assert run._exit is not None and run._exit.exited.done()
        finally:
            os.kill(stopped, signal.SIGCONT)
    assert (outcome.exit_code, outcome.error_kind) == (0, None)
    assert (sup.read_record(run.spec.spool_dir, sup.END_NAME) or {})["pid"] == identity.pid


async def test_the_zygote_exits_when_its_gateway_closes_it_and_its_runs_go_on(
        tmp_path: Path) -> None:
    (run,), go = waiting_runs(tmp_path, 1, "closing")
    with anyio.fail_after(scaled(DEADLINE_S)):
        await run.start()
        old = zygote_pid()
        ZYGOTE.close()  # what a stopping gateway does
        await until(lambda: gone(old), "the zygote to exit at EOF")
        go.touch()
        outcome = await run.wait()
    assert outcome.exit_code == 0 and run.stdout_path.read_text().strip() == "closing"


def stop_each_zygote_before_it_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fork request goes to a zygote that is stopped (SIGSTOP) first: it can neither
    fork nor answer, and is killed at FORK_ANSWER_TIMEOUT_S. The zygotes' pids, in order."""
    stopped: list[int] = []
    real = forks.Link.fork

    async def fork_to_a_stopped_zygote(self: forks.Link, run: dict[str, object]) -> int:
        stopped.append(self.pid)
        os.kill(self.pid, signal.SIGSTOP)
        return await real(self, run)

    monkeypatch.setattr(forks.Link, "fork", fork_to_a_stopped_zygote)
    return stopped


async def test_two_unanswered_forks_fail_the_launch_and_nothing_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither zygote forked: the launch claims the run as unstarted, so no supervisor that
    # comes later can start it, and fails with a message that says nothing ran.
    (run,), go = waiting_runs(tmp_path, 1, "never")
    go.touch()
    with monkeypatch.context() as patch, anyio.fail_after(scaled(DEADLINE_S)):
        patch.setattr(forks, "FORK_ANSWER_TIMEOUT_S", 0.3)
        patch.setattr(runner, "SUPERVISOR_START_TIMEOUT_S", 0.3)
        stopped = stop_each_zygote_before_it_reads(patch)
        with pytest.raises(GatewayError) as failure:
            await run.start()
        await until(lambda: all(gone(pid) for pid in stopped), "the stopped zygotes to die")
    assert failure.value.kind is ErrorKind.LAUNCH_FAILED
    assert "zygote stopped answering" in str(failure.value)
    assert "nothing ran" in str(failure.value)
    assert len(stopped) == 2 and stopped[0] != stopped[1]  # the second went to a new one
    claim = sup.read_record(run.spec.spool_dir, sup.START_NAME) or {}
    assert (claim.get("kind"), claim.get("zygote")) == ("unstarted", "unanswered")
    assert not run.stdout_path.exists() or run.stdout_path.read_text() == ""
    temp = sup.read_record(run.spec.spool_dir, spool.TEMP_CWD_NAME) or {}
    assert temp.get("path") and not Path(str(temp["path"])).exists()  # not left behind
    assert sup.read_record(run.spec.spool_dir, sup.END_NAME) is None
    # A run that comes next gets a zygote that works.
    (after,), go_after = waiting_runs(tmp_path, 1, "after")
    go_after.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        await after.start()
        assert (await after.wait()).exit_code == 0
    assert zygote_pid() not in stopped


async def test_two_lost_answers_still_run_the_launch_once_under_its_claimant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both zygotes forked and died before they answered: two supervisors of the same launch,
    # one claim. The gateway finds the claimant in the claim and polls its exit (no zygote
    # of its own reports it); the other exits without running anything.
    forked = lose_answers(monkeypatch, 2)
    (run,), go = waiting_runs(tmp_path, 1, "lost-twice")
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        await until(lambda: all(gone(pid) for pid in forked[1:]), "the loser to exit")
        go.touch()
        outcome = await run.wait()
    claim = sup.read_record(run.spec.spool_dir, sup.START_NAME) or {}
    assert len(forked) == 2 and identity.pid == int(claim["pid"]) == forked[0]
    assert (outcome.exit_code, outcome.error_kind) == (0, None)
    assert run.stdout_path.read_text().splitlines() == ["lost-twice"]  # it ran once
    assert (sup.read_record(run.spec.spool_dir, sup.END_NAME) or {})["pid"] == forked[0]


async def test_a_link_keeps_an_exit_reported_before_its_watcher_and_tells_late_watchers(
        tmp_path: Path) -> None:
    # A supervisor can exit before anyone watches it (an instant run, a bad spool): the
    # zygote's report is kept for the watcher. Once the zygote is gone a watcher hears None
    # at once (its exit is polled then), and the link refuses forks: nothing was sent.
    link = forks.Link(asyncio.get_running_loop())
    try:
        empty_spool = tmp_path / "empty-spool"  # no run.json: the supervisor gives up at once
        empty_spool.mkdir()
        pid = await link.fork({
            "spool_dir": str(empty_spool), "token": "t", "env": {}, "finalizer": None})
        await until(lambda: link.has_exited(pid), "the zygote to report the exit")
        heard: list[int | None] = []
        link.watch(pid, heard.append)
        assert heard and heard[0] is not None and heard[0] != 0
        assert not link.has_exited(pid)  # taken by its watcher
    finally:
        link.close()
    await until(lambda: not link.alive, "the zygote to exit at EOF")
    late: list[int | None] = []
    link.watch(pid, late.append)
    assert late == [None]
    with pytest.raises(BrokenPipeError):
        await link.fork({"spool_dir": str(tmp_path), "token": "t", "env": {}, "finalizer": None})


async def test_requests_the_pipe_cannot_take_wait_their_turn_without_blocking_the_loop(
        tmp_path: Path) -> None:
    # The loop writes fork requests itself: a zygote that reads none for a while (stopped
    # here; forking under a burst of large environments in life) must not block it. What the
    # pipe does not take waits, in order, and every request is answered once it reads again.
    link = forks.Link(asyncio.get_running_loop())
    rescued = threading.Event()

    def rescue() -> None:  # only if the loop itself blocked in a write: the test fails
        rescued.set()
        os.kill(link.pid, signal.SIGCONT)

    safety = threading.Timer(DEADLINE_S, rescue)
    try:
        os.kill(link.pid, signal.SIGSTOP)
        safety.start()
        spools = [tmp_path / f"spool-{i}" for i in range(4)]  # no run.json: each gives up
        env = {"PADDING": "x" * 40_000}  # 4 x 40 KB: more than a pipe holds (64 KiB)
        forking = []
        for spool_dir in spools:
            spool_dir.mkdir()
            forking.append(asyncio.ensure_future(link.fork(
                {"spool_dir": str(spool_dir), "token": "t", "env": env, "finalizer": None})))
        await until(lambda: link._writing, "the requests the pipe did not take to wait")
        os.kill(link.pid, signal.SIGCONT)
        safety.cancel()
        with anyio.fail_after(scaled(DEADLINE_S)):
            pids = await asyncio.gather(*forking)
    finally:
        safety.cancel()
        link.close()
        await until(lambda: not link.alive and link.popen.poll() is not None,
                    "the zygote to exit at EOF and be reaped")
    assert not rescued.is_set()
    assert len(set(pids)) == len(spools) and not link._outbox


async def idle_spare(tmp_path: Path, tag: str) -> int:
    """Run one run to its end, then wait for the idle zygote's spare: its only child."""
    (run,), go = waiting_runs(tmp_path, 1, tag)
    go.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        await run.start()
        await run.wait()
    zygote = psutil.Process(zygote_pid())
    await until(lambda: len(zygote.children()) == 1, "the idle zygote to fork a spare")
    return zygote.children()[0].pid


async def test_an_idle_zygote_forks_the_next_run_s_supervisor_ahead_of_it(
        tmp_path: Path) -> None:
    spare = await idle_spare(tmp_path, "before")
    assert os.getsid(spare) == spare and os.getpgid(spare) == spare  # a session of its own
    (run,), go = waiting_runs(tmp_path, 1, "spare")
    go.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        outcome = await run.wait()
    assert identity.pid == spare  # the run cost no fork on its path
    assert (outcome.exit_code, run.stdout_path.read_text().strip()) == (0, "spare")
    assert (sup.read_record(run.spec.spool_dir, sup.END_NAME) or {})["pid"] == spare


async def test_a_spare_killed_unused_is_never_reported_and_the_next_run_is_forked(
        tmp_path: Path) -> None:
    spare = await idle_spare(tmp_path, "unused")
    os.kill(spare, signal.SIGKILL)
    await until(lambda: not psutil.pid_exists(spare), "the zygote to reap its spare")
    (run,), go = waiting_runs(tmp_path, 1, "after-spare")
    go.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        identity = await run.start()
        outcome = await run.wait()
    assert identity.pid != spare and outcome.exit_code == 0
    link = ZYGOTE._link
    assert link is not None and not link.has_exited(spare)  # no run of that pid ended


async def test_a_spare_leaves_with_its_zygote(tmp_path: Path) -> None:
    spare = await idle_spare(tmp_path, "closed")
    ZYGOTE.close()
    await until(lambda: gone(spare), "the spare to leave at its zygote's EOF")
    spare = await idle_spare(tmp_path, "killed")
    os.kill(zygote_pid(), signal.SIGKILL)
    await until(lambda: gone(spare), "the spare to leave when its zygote is killed")


def test_the_zygote_imports_nothing_that_hooks_fork(platform_impl: str) -> None:
    """threading registers a fork hook (os.register_at_fork) that runs in every forked
    supervisor: 0.45 ms of CPU and ~125 copied pages a run. The zygote and the supervisor
    avoid it; on `portable` psutil imports it, which that path pays (bench/README.md)."""
    chosen = platform.supervisor_spec()
    code = (f"import sys; sys.path.append({str(forks.RUN_DIR)!r}); "
            "sys.path.extend(sys.argv[2:]); import zygote; __import__(sys.argv[1]); "
            "print(sorted({'threading', 'subprocess'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(chosen["platform"]),
                          *chosen["platform_path"]],
                         capture_output=True, text=True, check=True, timeout=DEADLINE_S)
    expected = "[]" if platform_impl == "linux" else "['subprocess', 'threading']"
    assert out.stdout.strip() == expected


async def test_a_zygote_whose_gateway_stopped_reading_still_settles_the_runs_that_ended(
        tmp_path: Path, children: Children) -> None:
    """A gateway that closes its zygote (or is SIGKILLed) stops reading it too: the exit
    line of a run that ends then meets EPIPE. The zygote says nothing more, and at its EOF
    still starts the gateway's finalizer for that run, which nobody else would."""
    spool = tmp_path / "spool"
    spool.mkdir()
    go = tmp_path / "go"
    sup.write_record(spool, sup.RUN_NAME, {
        "version": sup.RECORD_VERSION, "token": "t0", "job_id": "job",
        "argv": [sys.executable, "-c", "import os, sys, time" + WAIT_FOR_GO, "ended", str(go)],
        "cwd": str(spool),
        "temp_cwd": False, "stdin": False, "timeout_s": 60.0, "idle_timeout_s": None,
        "max_output_bytes": 1 << 20, "kill_grace_s": 0.3, "nice": None,
        "autogroup_nice": None, **platform.supervisor_spec()})
    finalized = tmp_path / "finalized"
    finalizer = {  # a live "gateway" (this process): the supervisor leaves it to the zygote
        "argv": [sys.executable, "-c", f"import sys; open({str(finalized)!r}, 'w').write("
                 "sys.argv[1] + ' ' + sys.stdin.read())"],
        "env": {}, "settings": "settings", "gateway_pid": os.getpid(),
        "gateway_started_at": proc.process_start_time(os.getpid())}
    chosen = platform.supervisor_spec()
    zygote = children.track(subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", forks.ZYGOTE_BOOT, str(chosen["platform"]),
         *chosen["platform_path"]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True))
    assert zygote.stdin is not None and zygote.stdout is not None
    zygote.stdin.write(json.dumps({"id": 1, "spool_dir": str(spool), "token": "t0",
                                   "env": {}, "finalizer": finalizer}).encode() + b"\n")
    zygote.stdin.flush()
    answer = json.loads(await anyio.to_thread.run_sync(zygote.stdout.readline))
    zygote.stdout.close()  # the gateway stops reading
    go.touch()
    with anyio.fail_after(scaled(DEADLINE_S)):
        while sup.read_record(spool, sup.END_NAME) is None:
            await anyio.sleep(0.02)
        await until(lambda: gone(answer["pid"]), "the run's supervisor to exit")
        zygote.stdin.close()  # and then its EOF
        assert await anyio.to_thread.run_sync(zygote.wait) == 0
        await until(finalized.exists, "the zygote to start the finalizer")
        await until(lambda: finalized.read_text() == f"{spool} settings",
                    "the finalizer to read its settings")
