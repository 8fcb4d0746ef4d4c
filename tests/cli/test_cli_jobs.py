"""`jobs list|show|result|wait|cancel` as subprocesses, against SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime
from typing import Any

import pytest

from gateway.model import Completion, InstanceRow, JobStatus, NewJob
from tests.cli.cli_support import CLI_TIMEOUT_S, Cli, hermetic_env, write_config

ANSWER = "héllo wörld, " * 500  # multi-byte characters: pages split them mid-way
LIVE_OWNER = "instance-live"
# Seeded ids: `done` and `failed` share the prefix "aaaa" (an ambiguous prefix).
IDS = {"done": "aaaa1111-0000-4000-8000-000000000001",
       "failed": "aaaa2222-0000-4000-8000-000000000002",
       "running": "bbbb3333-0000-4000-8000-000000000003",
       "stray": "cccc4444-0000-4000-8000-000000000004"}
PROMPTS = {"done": "Explain the lease design\nin detail, please", "failed": "fix the bug",
           "running": "write the docs", "stray": "x" * 300}


def seed(cli: Cli) -> dict[str, str]:
    """A completed, a failed, a running and an ownerless queued job."""
    async def run(store: Any) -> None:
        await store.register_instance(InstanceRow(
            instance_id=LIVE_OWNER, hostname="h", boot_id="b", pid=1, pid_started_at=None,
            role="stdio", version="t"), ttl_s=3600)
        for name, provider, owner in [("done", "claude", LIVE_OWNER),
                                      ("failed", "codex", LIVE_OWNER),
                                      ("running", "claude", LIVE_OWNER),
                                      ("stray", "gemini", "instance-gone")]:
            request: dict[str, Any] = {"provider": provider, "prompt": PROMPTS[name], "model": None,
                       "options": {}}
            await store.insert_job(NewJob(
                id=IDS[name], provider=provider, request_key=f"key-{name}",
                owner_instance=owner, hostname="elsewhere",
                request_json=json.dumps(request)), ttl_s=3600)
        await store.mark_running(IDS["running"], LIVE_OWNER, ttl_s=3600)
        await store.record_process(IDS["running"], LIVE_OWNER, 4242, 4242, 1.0)
        await store.mark_running(IDS["done"], LIVE_OWNER, ttl_s=3600)
        await store.complete(IDS["done"], LIVE_OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output='{"raw": "stdout"}',
            output_bytes=17, result_json=json.dumps({"text": ANSWER, "session_id": "s-1"})))
        await store.complete(IDS["failed"], LIVE_OWNER, Completion(
            status=JobStatus.FAILED, exit_code=3, error="boom", error_kind="provider_error",
            stderr_tail="something broke\n"))

    cli.in_store(run)
    return IDS


# -- list -------------------------------------------------------------------------------------


def test_jobs_list_shows_prompts_relative_times_and_filters(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "list", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["ID", "PROVIDER", "STATUS", "CREATED", "RAN", "PROMPT"]
    assert all(job_id[:8] in done.stdout for job_id in ids.values())
    assert "Explain the lease design" in done.stdout and "in detail" not in done.stdout
    assert "ago" in done.stdout
    assert all(len(line) <= 100 for line in lines)  # the prompt is cut to the width
    assert any(line.endswith("…") for line in lines)
    assert "\033[" not in done.stdout  # a pipe gets no colour

    only = cli.run("jobs", "list", "--status", "failed", "--status", "completed",
                   "--provider", "codex")
    assert only.returncode == 0, only.stderr
    assert ids["failed"][:8] in only.stdout
    assert ids["done"][:8] not in only.stdout and ids["running"][:8] not in only.stdout

    limited = cli.run("jobs", "list", "--limit", "1")
    assert len(limited.stdout.splitlines()) == 2  # header + one job


def test_jobs_list_json_is_one_object_per_job_with_stable_keys(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "list", "--json")
    assert done.returncode == 0, done.stderr
    jobs = json.loads(done.stdout)
    assert sorted(job["id"] for job in jobs) == sorted(ids.values())
    keys = {frozenset(job) for job in jobs}
    assert len(keys) == 1  # every object has the same keys
    by_id = {job["id"]: job for job in jobs}
    failed = by_id[ids["failed"]]
    assert failed["status"] == "failed" and failed["error_kind"] == "provider_error"
    assert failed["prompt"] == "fix the bug"
    assert datetime.fromisoformat(failed["created_at"]).tzinfo is not None
    assert by_id[ids["done"]]["prompt"] == "Explain the lease design"
    assert by_id[ids["stray"]]["started_at"] is None


def test_jobs_list_is_coloured_on_a_terminal_unless_no_color(sqlite_cli: Cli) -> None:
    seed(sqlite_cli)

    def on_a_terminal(env: dict[str, str]) -> str:
        done = sqlite_cli.on_a_terminal("jobs", "list", env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    assert "\033[31;1mfailed" in on_a_terminal({})
    assert "\033[" not in on_a_terminal({"NO_COLOR": "1"})


def test_jobs_list_before_any_store_exists_says_so_and_creates_nothing(home: Any) -> None:
    cli = Cli(home, write_config(home, f'[persistence]\npath = "{home / "db" / "j.db"}"\n'),
              "sqlite")
    done = cli.run("jobs", "list")
    assert done.returncode == 0, done.stderr
    assert "No jobs yet" in done.stdout
    assert json.loads(cli.run("jobs", "list", "--json").stdout) == []
    assert not (home / "db").exists()  # reading creates nothing


# -- ids --------------------------------------------------------------------------------------


def test_a_unique_prefix_names_a_job_everywhere(cli: Cli) -> None:
    ids = seed(cli)
    shown = cli.run("jobs", "show", "aaaa2", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == ids["failed"]
    assert cli.run("jobs", "result", "aaaa1").stdout == ANSWER + "\n"
    assert cli.run("jobs", "wait", "aaaa1").returncode == 0
    assert "Cancel requested" in cli.run("jobs", "cancel", "bbbb").stdout


def test_an_ambiguous_prefix_lists_the_candidates(cli: Cli) -> None:
    ids = seed(cli)
    for action in ("show", "result", "tail", "wait", "cancel"):
        done = cli.run("jobs", action, "aaaa")
        assert done.returncode == 1, (action, done.stdout)
        assert "ambiguous" in done.stderr
        assert ids["done"] in done.stderr and ids["failed"] in done.stderr
        assert "Traceback" not in done.stderr


def test_an_unknown_id_exits_1(cli: Cli) -> None:
    seed(cli)
    for action in ("show", "result", "tail", "wait", "cancel"):
        done = cli.run("jobs", action, "no-such-job")
        assert done.returncode == 1
        assert "no job 'no-such-job'" in done.stderr
        assert "Traceback" not in done.stderr
    # LIKE wildcards typed as an id are characters, not patterns.
    assert "no job '%'" in cli.run("jobs", "show", "%").stderr
    assert "no job '____'" in cli.run("jobs", "show", "____").stderr


# -- show -------------------------------------------------------------------------------------


def test_jobs_show_json_has_iso_times_the_request_the_run_and_the_answer_size(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "show", ids["done"], "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    for key in ("created_at", "started_at", "finished_at", "updated_at"):
        assert datetime.fromisoformat(info[key]).tzinfo is not None, key
    assert isinstance(info["ran_s"], float) and info["ran_s"] >= 0
    assert info["request"]["prompt"] == PROMPTS["done"]
    assert info["answer_bytes"] == len(ANSWER.encode())
    assert info["output_bytes"] == 17
    assert info["result"] == {"session_id": "s-1"}  # the answer is for `jobs result`
    # The session the CLI reported (what a caller resumes), not only the one it asked for.
    assert info["session_id"] is None and info["reported_session_id"] == "s-1"
    shown = cli.run("jobs", "show", ids["done"]).stdout.splitlines()
    assert "session      s-1" in shown
    assert info["owner"]["instance_id"] == LIVE_OWNER and info["owner"]["lease_held"] is True

    running = json.loads(cli.run("jobs", "show", ids["running"], "--json").stdout)
    assert running["run"] == {"hostname": "elsewhere", "this_host": False, "pid": 4242,
                              "pgid": 4242, "pid_started_at": "1970-01-01T00:00:01Z",
                              "alive": None}
    stray = json.loads(cli.run("jobs", "show", ids["stray"], "--json").stdout)
    assert stray["owner"] is None and stray["status"] == "queued"


def test_jobs_show_text_says_status_times_and_where(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "show", ids["failed"])
    assert done.returncode == 0, done.stderr
    fields = {line.split(None, 1)[0]: line for line in done.stdout.splitlines() if line}
    assert "failed  provider_error: boom" in fields["status"]
    assert "ago)" in fields["created"]
    assert "something broke" in done.stdout
    running = cli.run("jobs", "show", ids["running"]).stdout
    assert "elsewhere pid 4242 (unknown (another host))" in running
    assert "lease held" in running


def test_jobs_show_never_prints_a_secret_of_the_request(cli: Cli) -> None:
    job_id = str(uuid.uuid4())

    async def run(store: Any) -> None:
        request: dict[str, Any] = {"provider": "api", "messages": [{"role": "user", "content": "hi"}],
                   "headers": {"Authorization": "Bearer sk-secret-value"}}
        await store.insert_job(NewJob(id=job_id, provider="api", request_key="k",
                                      owner_instance=LIVE_OWNER, transport="http",
                                      request_json=json.dumps(request)), ttl_s=60)

    cli.in_store(run)
    for args in (["show", job_id], ["show", job_id, "--json"], ["list", "--json"]):
        done = cli.run("jobs", *args)
        assert done.returncode == 0, done.stderr
        assert "sk-secret-value" not in done.stdout
    assert json.loads(cli.run("jobs", "list", "--json").stdout)[0]["prompt"] == "hi"


# -- result, wait, cancel ---------------------------------------------------------------------


def test_jobs_result_pages_concatenate_to_the_exact_answer(sqlite_cli: Cli) -> None:
    seed(sqlite_cli)
    expected = ANSWER.encode()
    pages: list[bytes] = []
    offset = 0
    while True:
        done = subprocess.run(sqlite_cli.argv("jobs", "result", IDS["done"], "--offset",
                                              str(offset), "--max-bytes", "1001"),
                              env=hermetic_env(sqlite_cli.home), capture_output=True,
                              timeout=CLI_TIMEOUT_S, check=False)
        assert done.returncode == 0, done.stderr
        pages.append(done.stdout)
        offset += len(done.stdout)
        if b"next page" not in done.stderr:
            break
        assert f"--offset {offset}".encode() in done.stderr
    assert len(pages) == -(-len(expected) // 1001)
    assert b"".join(pages) == expected


def test_jobs_result_prints_the_answer_or_the_raw_stdout_ending_with_a_newline(cli: Cli) -> None:
    job_id = str(uuid.uuid4())
    output = "banner\nthe ánswer"

    async def run(store: Any) -> None:
        await store.insert_job(NewJob(id=job_id, provider="devin", request_key="key-span",
                                      owner_instance=LIVE_OWNER), ttl_s=3600)
        await store.complete(job_id, LIVE_OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output=output,
            output_bytes=len(output.encode()), result_json=json.dumps({"text_span": [7, 18]})))

    cli.in_store(run)
    done = cli.run("jobs", "result", job_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the ánswer\n"
    assert cli.run("jobs", "result", job_id, "--raw").stdout == output + "\n"


def test_jobs_result_prints_a_300_kb_answer_whole_and_max_bytes_still_pages(cli: Cli) -> None:
    """`jobs result ID > file` gets the whole answer, not its first page (#25)."""
    job_id = str(uuid.uuid4())
    answer = "ünïcode line of a long answer\n" * 10_000  # 320 000 bytes, past 64 KiB and 200 KB

    async def run(store: Any) -> None:
        await store.insert_job(NewJob(id=job_id, provider="claude", request_key="key-big",
                                      owner_instance=LIVE_OWNER), ttl_s=3600)
        await store.complete(job_id, LIVE_OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output="{}", output_bytes=2,
            result_json=json.dumps({"text": answer})))

    cli.in_store(run)
    whole = subprocess.run(cli.argv("jobs", "result", job_id), env=hermetic_env(cli.home),
                           capture_output=True, timeout=CLI_TIMEOUT_S, check=False)
    assert whole.returncode == 0, whole.stderr
    assert len(answer.encode()) >= 300_000
    assert whole.stdout == answer.encode()
    assert whole.stderr == b""  # nothing to page on: no "next page" note
    page = subprocess.run(cli.argv("jobs", "result", job_id, "--max-bytes", "1000"),
                          env=hermetic_env(cli.home), capture_output=True,
                          timeout=CLI_TIMEOUT_S, check=False)
    assert page.returncode == 0, page.stderr
    assert page.stdout == answer.encode()[:1000]
    assert b"--offset 1000 --max-bytes 1000" in page.stderr
    rest = subprocess.run(cli.argv("jobs", "result", job_id, "--offset", "1000"),
                          env=hermetic_env(cli.home), capture_output=True,
                          timeout=CLI_TIMEOUT_S, check=False)
    assert page.stdout + rest.stdout == answer.encode()


def test_jobs_result_of_a_failed_or_running_job_exits_with_its_outcome(cli: Cli) -> None:
    ids = seed(cli)
    failed = cli.run("jobs", "result", ids["failed"])
    assert failed.returncode == 3
    assert "failed (provider_error: boom)" in failed.stderr
    running = cli.run("jobs", "result", ids["running"])
    assert running.returncode == 8
    assert running.stdout == "" and "jobs tail -f" in running.stderr


def test_jobs_wait_exits_with_the_outcome_or_8_after_its_timeout(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "wait", ids["done"])
    assert (done.returncode, done.stdout) == (0, "completed\n")
    failed = cli.run("jobs", "wait", ids["failed"])
    assert (failed.returncode, failed.stdout) == (3, "failed\n")
    waiting = cli.run("jobs", "wait", ids["running"], "--timeout", "0.5")
    assert (waiting.returncode, waiting.stdout) == (8, "running\n")
    assert "still running after 0.5 s" in waiting.stderr


def test_jobs_cancel_requests_a_cancel_on_the_row(cli: Cli) -> None:
    ids = seed(cli)
    done = cli.run("jobs", "cancel", ids["running"])
    assert done.returncode == 0, done.stderr
    assert "Cancel requested" in done.stdout and "cancel poller" in done.stdout
    row = cli.in_store(lambda store: store.get_job(ids["running"]))
    assert row is not None and row.cancel_requested_at is not None
    assert row.status is JobStatus.RUNNING  # the owner's poller does the rest

    gone = cli.run("jobs", "cancel", ids["stray"])
    assert gone.returncode == 0 and "does not look alive" in gone.stdout

    finished = cli.run("jobs", "cancel", ids["done"])
    assert finished.returncode == 1
    assert "already finished as completed" in finished.stdout


def test_reading_commands_never_migrate_a_store_of_another_version(sqlite_cli: Cli) -> None:
    import sqlite3

    seed(sqlite_cli)
    db = sqlite_cli.settings.persistence.path
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (99, 0)")
    done = sqlite_cli.run("jobs", "list")
    assert done.returncode == 1
    assert "schema is version 99" in done.stderr and "upgrade agent-cli-gateway" in done.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 99


@pytest.mark.parametrize("args", [["jobs", "list"], ["instances"]])
def test_the_memory_backend_is_refused(home: Any, args: list[str]) -> None:
    cli = Cli(home, write_config(home, '[persistence]\nbackend = "memory"\n'), "memory")
    done = cli.run(*args)
    assert done.returncode == 1
    assert "'memory'" in done.stderr


def test_an_unusable_store_is_one_line_and_exit_1(home: Any) -> None:
    garbage = home / "garbage.db"
    garbage.write_text("this is not an SQLite database\n" * 20)
    cli = Cli(home, write_config(home, f'[persistence]\npath = "{garbage}"\n'), "sqlite")
    done = cli.run("jobs", "list")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("agent-cli-gateway: ")]
    assert ours == ["agent-cli-gateway: the job store is unavailable: sqlite store: cannot "
                    "read it: file is not a database"]
    debug = cli.run("jobs", "list", "--debug")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr
