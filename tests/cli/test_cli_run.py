"""`run` and `jobs tail` as subprocesses: real gateways driving the fake CLIs, a tail that
follows a running job from its spool (this host) or from its row (another host)."""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
import uuid
from typing import IO, Any

import pytest

from gateway import proc
from gateway.cli.common import job_exit_code
from gateway.jobs.run import spool
from gateway.model import Completion, InstanceRow, JobRow, JobStatus, NewJob, Progress
from tests.cli.cli_support import CLI_TIMEOUT_S, Cli
from tests.waiting import scaled, wait_until

WAIT_LIMIT_S = scaled(30.0)  # a condition that takes longer than this on a busy box is a failure
POLL_S = 0.05


class Reader:
    """The lines a child writes, as they come (a thread; never a sleep-and-hope)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        with stream:  # closed at its end: an unclosed pipe is a ResourceWarning, an error here
            for line in stream:
                self.lines.put(line)
        self.lines.put(None)

    def drain(self, limit_s: float = WAIT_LIMIT_S) -> None:
        """Everything left, up to the end of the stream."""
        deadline = time.monotonic() + limit_s
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            self.seen.append(line)

    def until(self, fragment: str, limit_s: float = WAIT_LIMIT_S) -> str:
        deadline = time.monotonic() + limit_s
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"stream ended before {fragment!r}: {self.seen}")
            self.seen.append(line)
            if fragment in line:
                return line


def row(cli: Cli, job_id: str) -> Any:
    return cli.in_store(lambda store: store.get_job(job_id))


def only_job_id(cli: Cli) -> str | None:
    jobs = cli.in_store(lambda store: store.list_jobs(limit=5))
    return jobs[0].id if jobs else None


# -- run --------------------------------------------------------------------------------------


def test_run_prints_the_answer_and_leaves_a_completed_job_and_a_stopped_instance(
    cli: Cli,
) -> None:
    done = cli.run("run", "claude", "say hi @stream=3:0.05")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fake-claude answer: say hi @stream=3:0.05\n"
    job_id = only_job_id(cli)
    assert job_id is not None and f"job {job_id} running" in done.stderr  # a free run slot
    assert f"job {job_id} completed after" in done.stderr
    stored = row(cli, job_id)
    assert stored.status is JobStatus.COMPLETED and stored.provider == "claude"
    instances = json.loads(cli.run("instances", "--json", "--all").stdout)
    assert [(i["role"], i["active_jobs"]) for i in instances] == [("cli", 0)]
    assert instances[0]["stopped_at"] is not None


def test_run_exits_with_the_jobs_outcome(cli: Cli) -> None:
    done = cli.run("run", "claude", "break @exit=3")
    assert done.returncode == 3, done.stderr
    assert "failed (provider_error" in done.stderr
    bad = cli.run("run", "nosuchprovider", "hi")
    assert bad.returncode == 2 and "invalid_input" in bad.stderr  # the input must change
    assert "Traceback" not in bad.stderr
    assert cli.in_store(lambda store: store.list_jobs(limit=5))[0].status is JobStatus.FAILED


def test_run_stopped_by_a_signal_ends_its_job_instead_of_leaving_it_running(
    sqlite_cli: Cli,
) -> None:
    child = sqlite_cli.popen("run", "claude", "long @sleep=60")
    try:
        job_id = wait_until(lambda: only_job_id(sqlite_cli))
        wait_until(lambda: row(sqlite_cli, job_id).pid is not None)
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    ended = row(sqlite_cli, job_id)
    assert ended.status is JobStatus.FAILED and ended.error_kind == "shutdown"
    instance = sqlite_cli.in_store(lambda store: store.list_instances())[0]
    assert instance.stopped_at is not None


def test_run_async_returns_the_id_at_once_and_the_job_runs_to_completion(cli: Cli) -> None:
    done = cli.run("run", "claude", "in the background @sleep=3", "--async")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert uuid.UUID(job_id) and "jobs tail -f" in done.stderr
    assert row(cli, job_id).status.is_active  # the command returned before the job ended
    waited = cli.run("jobs", "wait", job_id[:8], "--timeout", str(WAIT_LIMIT_S))
    assert (waited.returncode, waited.stdout) == (0, "completed\n"), waited.stderr
    result = cli.run("jobs", "result", job_id)
    assert result.stdout == "fake-claude answer: in the background @sleep=3\n"


# -- tail -------------------------------------------------------------------------------------


def test_tail_follows_a_running_job_from_its_spool_to_its_end(cli: Cli) -> None:
    # A long stream, ended by a cancel once the tail has shown it live: no race with the
    # job finishing on its own before the tail has started.
    started = cli.run("run", "claude", "follow me @stream=600:0.1", "--async")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    tail = cli.popen("jobs", "tail", "-f", "--raw", job_id)
    try:
        assert tail.stdout is not None
        reader = Reader(tail.stdout)
        reader.until("progress 1/600")
        reader.until("progress 3/600")  # more arrives while it runs
        assert row(cli, job_id).status is JobStatus.RUNNING
        assert cli.run("jobs", "cancel", job_id).returncode == 0
        assert tail.wait(CLI_TIMEOUT_S) == 5  # cancelled
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
        if tail.stderr is not None:
            tail.stderr.close()
    reader.drain()
    stored = row(cli, job_id)
    assert stored.status is JobStatus.CANCELLED
    assert "".join(reader.seen) == stored.output  # every byte, once, in order


def test_tail_parsed_shows_the_text_as_it_grows(sqlite_cli: Cli) -> None:
    # devin prints plain text: its parsed view is the progress lines as they come.
    started = sqlite_cli.run("run", "devin", "grow @stream=600:0.1", "--async")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    tail = sqlite_cli.popen("jobs", "tail", job_id, "-f")
    try:
        assert tail.stdout is not None
        reader = Reader(tail.stdout)
        reader.until("progress 2/600")
        reader.until("progress 4/600")
        assert row(sqlite_cli, job_id).status is JobStatus.RUNNING
        assert sqlite_cli.run("jobs", "cancel", job_id).returncode == 0
        assert tail.wait(CLI_TIMEOUT_S) == 5
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
        if tail.stderr is not None:
            tail.stderr.close()
    reader.drain()
    assert sum("progress 2/600" in line for line in reader.seen) == 1  # nothing repeated
    snapshot = sqlite_cli.run("jobs", "tail", job_id)  # no -f: what there is, then exit
    assert snapshot.returncode == 5
    assert snapshot.stdout.startswith("fake-devin progress 1/600\n")


def test_tail_of_another_hosts_job_reads_the_flushed_row_and_exits_with_its_outcome(
    cli: Cli,
) -> None:
    owner, job_id = "instance-far", str(uuid.uuid4())

    async def start(store: Any) -> None:
        await store.register_instance(InstanceRow(
            instance_id=owner, hostname="far-away", boot_id="b", pid=1, pid_started_at=None,
            role="http", version="t"), ttl_s=3600)
        await store.insert_job(NewJob(id=job_id, provider="claude", request_key="k",
                                      owner_instance=owner, hostname="far-away"), ttl_s=3600)
        await store.mark_running(job_id, owner, ttl_s=3600)
        await store.record_process(job_id, owner, 99, 99, 1.0)
        await store.save_progress(job_id, owner, Progress(output_bytes=6, output="first\n"))

    cli.in_store(start)
    tail = cli.popen("jobs", "tail", "-f", "--raw", job_id)
    try:
        assert tail.stdout is not None
        reader = Reader(tail.stdout)
        reader.until("first")
        cli.in_store(lambda store: store.save_progress(
            job_id, owner, Progress(output_bytes=13, output="first\nsecond\n")))
        reader.until("second")
        cli.in_store(lambda store: store.complete(job_id, owner, Completion(
            status=JobStatus.FAILED, exit_code=2, error="bad", error_kind="provider_error",
            output="first\nsecond\nthird\n", output_bytes=19)))
        reader.until("third")
        assert tail.wait(CLI_TIMEOUT_S) == 3  # failed
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
        if tail.stderr is not None:
            tail.stderr.close()
    assert "".join(reader.seen) == "first\nsecond\nthird\n"


def test_tail_of_a_job_of_this_host_whose_spool_cannot_be_read_falls_back_to_its_row(
    cli: Cli,
) -> None:
    """One rule for a running job's output so far (gateway.jobs.reads.live_stdout), in
    result pages and `jobs tail` alike: the spool file when it runs on this host and the
    file can be read, else the row's flushed tail. tail.py had its own copy that trusted a
    spool path that merely existed and died with a traceback when it could not be read."""
    owner, job_id = "instance-here", str(uuid.uuid4())
    hostname = proc.hostname()

    async def start(store: Any) -> JobRow:
        await store.register_instance(InstanceRow(
            instance_id=owner, hostname=hostname, boot_id="b", pid=1, pid_started_at=None,
            role="http", version="t"), ttl_s=3600)
        await store.insert_job(NewJob(id=job_id, provider="claude", request_key="k",
                                      owner_instance=owner, hostname=hostname), ttl_s=3600)
        await store.mark_running(job_id, owner, ttl_s=3600)
        await store.save_progress(job_id, owner, Progress(output_bytes=6, output="first\n"))
        found: JobRow | None = await store.get_job(job_id, with_output=False)
        assert found is not None
        return found

    job = cli.in_store(start)
    # Unreadable as a file whoever runs the test (root reads any mode): a directory.
    stdout = spool.stdout_path(spool.run_dir(spool.spool_root(cli.settings.state_dir), job))
    stdout.mkdir(parents=True)
    snapshot = cli.run("jobs", "tail", "--raw", job_id)
    assert "Traceback" not in snapshot.stderr, snapshot.stderr
    assert (snapshot.returncode, snapshot.stdout) == (job_exit_code(job), "first\n")


@pytest.mark.parametrize("status,code", [(JobStatus.CANCELLED, 5), (JobStatus.TIMED_OUT, 4)])
def test_tail_of_a_finished_job_prints_it_and_exits_with_its_outcome(
    sqlite_cli: Cli, status: JobStatus, code: int
) -> None:
    job_id = str(uuid.uuid4())

    async def finished(store: Any) -> None:
        await store.insert_job(NewJob(id=job_id, provider="devin", request_key="k",
                                      owner_instance="o"), ttl_s=60)
        await store.complete(job_id, "o", Completion(status=status, output="partial",
                                                     output_bytes=7))

    sqlite_cli.in_store(finished)
    done = sqlite_cli.run("jobs", "tail", job_id)
    assert (done.returncode, done.stdout) == (code, "partial\n")
    assert status.value in done.stderr
