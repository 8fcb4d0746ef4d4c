"""The command line's first-hour edges (#25): a mistyped command or provider gets a "did you
mean", a refused request reads alike with and without --async and exits 2 when the input
must change, a follow on a terminal says it is waiting, a store that is down is told in
plain lines, a missing driver names what to install."""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.cli_support import CLI_TIMEOUT_S, Cli, hermetic_env, write_config
from tests.test_packaging import REPO
from tests.waiting import scaled

WAIT_LIMIT_S = scaled(30.0)  # a condition that takes longer than this on a busy box is a failure


def read_terminal_until(master: int, fragment: bytes, count: int = 1,
                        limit_s: float = WAIT_LIMIT_S) -> bytes:
    """What a child wrote to its terminal, up to `count` occurrences of `fragment`."""
    seen = b""
    deadline = time.monotonic() + limit_s
    while seen.count(fragment) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"{fragment!r} x{count} not seen in time: {seen!r}"
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            assert data, f"the terminal closed before {fragment!r}: {seen!r}"
            seen += data
    return seen


def test_a_mistyped_command_gets_a_did_you_mean_and_exits_2(sqlite_cli: Cli) -> None:
    done = sqlite_cli.run("jobs", "lst")
    assert done.returncode == 2
    assert "unknown command 'lst' (did you mean 'list'?)" in done.stderr
    assert "choose from list, show, result, tail, wait, cancel" in done.stderr
    option = sqlite_cli.run("serve", "--transport", "htp")
    assert option.returncode == 2 and "(did you mean 'http'?)" in option.stderr


def test_a_mistyped_provider_gets_a_did_you_mean_the_list_and_exit_2_with_or_without_async(
        sqlite_cli: Cli) -> None:
    answers = [sqlite_cli.run("run", "claud", "hi"), sqlite_cli.run("run", "claud", "hi", "--async")]
    for done in answers:
        assert done.returncode == 2, done.stderr  # invalid_input: the input must change
        assert done.stderr.startswith(
            "agent-cli-gateway: invalid_input: unknown provider 'claud' (did you mean 'claude'?);"
            " known providers: claude, codex, cursor, devin, gemini, grok, mistral."), done.stderr
        assert "[" not in done.stderr  # the list is prose, not a Python repr
    assert answers[0].stderr == answers[1].stderr


def test_a_missing_cli_is_worded_alike_by_run_and_run_async(home: Path) -> None:
    config = write_config(home, f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n')
    grok = next(line for line in config.read_text().splitlines() if line.endswith('grok"'))
    config.write_text(config.read_text().replace(grok, 'command = "/nonexistent/grok"'))
    cli = Cli(home, config, "sqlite")
    sync, background = cli.run("run", "grok", "hi"), cli.run("run", "grok", "hi", "--async")
    assert sync.returncode == background.returncode == 1
    assert sync.stderr.startswith("agent-cli-gateway: not_found: ")
    assert background.stderr == sync.stderr


def test_jobs_tail_follow_on_a_terminal_says_it_waits_for_the_first_output(
        sqlite_cli: Cli) -> None:
    started = sqlite_cli.run("run", "devin", "quiet at first @sleep=60", "--async")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    master, slave = pty.openpty()
    tail = subprocess.Popen(sqlite_cli.argv("jobs", "tail", "-f", job_id),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env=hermetic_env(sqlite_cli.home))
    os.close(slave)
    try:
        shown = read_terminal_until(master, b"waiting for its first output")
        assert f"job {job_id[:8]} ".encode() in shown
        assert sqlite_cli.run("jobs", "cancel", job_id).returncode == 0
        assert tail.wait(CLI_TIMEOUT_S) == 5  # cancelled
        assert tail.stdout is not None
        assert b"waiting" not in tail.stdout.read()  # the note is the terminal's, not stdout's
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
        if tail.stdout is not None:
            tail.stdout.close()
        os.close(master)


def test_run_against_a_postgres_that_is_down_says_one_plain_line_per_retry_on_a_terminal(
        home: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = write_config(home, f'[persistence]\nbackend = "postgres"\n'
                                f'dsn = "postgresql://nobody@127.0.0.1:{port}/none"\n')
    cli = Cli(home, config, "postgres")
    master, slave = pty.openpty()
    child = subprocess.Popen(cli.argv("run", "devin", "hi"), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=slave, env=hermetic_env(home))
    os.close(slave)
    try:
        shown = read_terminal_until(master, b"left\r\n", count=2)
        child.send_signal(signal.SIGINT)
        child.wait(CLI_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(master)
    lines = [line for line in shown.decode().splitlines() if line.strip()]
    assert len(lines) >= 2
    for line in lines[:2]:
        assert line.startswith("agent-cli-gateway: the job store is not reachable ("), line
        assert "retrying" in line
    assert "{" not in shown.decode()  # no JSON log record


def test_jobs_list_without_the_postgres_driver_says_what_to_install(home: Path) -> None:
    config = write_config(home, '[persistence]\nbackend = "postgres"\n'
                                'dsn = "postgresql://nobody@127.0.0.1:1/none"\n')
    script = ("import sys\n"
              "sys.modules['asyncpg'] = None  # as if the extra was not installed\n"
              "from gateway.cli.main import main\n"
              f"raise SystemExit(main(['jobs', 'list', '--config', {str(config)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=home,
                          env={**hermetic_env(home), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    assert done.returncode == 1
    assert "ModuleNotFoundError" not in done.stderr and "Traceback" not in done.stderr
    assert "agent-cli-gateway[postgres]" in done.stderr
