"""#23 item 7: job data never drives the operator's terminal.

A CLI's output, stderr, error and prompt can hold escape sequences (window title, clear
screen, an OSC 52 clipboard write, erase line, the one-character C1 CSI). On a terminal
(a real pty here) every command that prints job data shows them visibly; through a pipe,
`--raw`, `--json` and the answer stay byte-exact. Against SQLite and PostgreSQL.
"""

from __future__ import annotations

import io
import json
import subprocess
from typing import Any

from gateway.cli.format import VisibleWriter, visible
from gateway.model import Completion, InstanceRow, JobStatus, NewJob
from tests.cli.cli_support import CLI_TIMEOUT_S, Cli, hermetic_env

HOSTILE = ("title\x1b]0;pwned\x07 clear\x1b[2J clip\x1b]52;c;ZXZpbA==\x07 erase\x1b[2K "
           "c1\u009b31m bs\x08end")
# What must never reach a terminal from job data (our own colour codes are `\x1b[..m`).
OBEYED = [b"\x1b]", b"\x1b[2J", b"\x1b[2K", b"\x07", b"\xc2\x9b", b"\x9b31m", b"\x08"]
RAW_STDOUT = HOSTILE.encode() + b"\n"
IDS = {"done": "dddd1111-0000-4000-8000-000000000001",
       "failed": "ffff2222-0000-4000-8000-000000000002"}
OWNER = "instance-term"
WIDE = {"COLUMNS": "500"}


def seed(cli: Cli) -> None:
    async def run(store: Any) -> None:
        await store.register_instance(InstanceRow(
            instance_id=OWNER, hostname="h", boot_id="b", pid=1, pid_started_at=None,
            role="stdio", version="t"), ttl_s=3600)
        for name in IDS:
            request: dict[str, Any] = {"provider": "claude", "prompt": HOSTILE, "model": None, "options": {}}
            await store.insert_job(NewJob(
                id=IDS[name], provider="claude", request_key=f"key-{name}",
                owner_instance=OWNER, hostname="elsewhere", request_json=json.dumps(request)),
                ttl_s=3600)
            await store.mark_running(IDS[name], OWNER, ttl_s=3600)
        await store.complete(IDS["done"], OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output=RAW_STDOUT.decode(),
            output_bytes=len(RAW_STDOUT), result_json=json.dumps({"text": HOSTILE})))
        await store.complete(IDS["failed"], OWNER, Completion(
            status=JobStatus.FAILED, exit_code=3, error=HOSTILE, error_kind="provider_error",
            stderr_tail=HOSTILE + "\n"))

    cli.in_store(run)


def on_a_terminal(cli: Cli, *args: str) -> tuple[bytes, str]:
    """(what the command wrote to its terminal, its stderr) with stdout on a wide pty."""
    done = cli.on_a_terminal(*args, env=WIDE)
    return done.stdout, done.stderr.decode()


def assert_shown_not_obeyed(written: bytes, what: str) -> None:
    for sequence in OBEYED:
        assert sequence not in written, (what, sequence, written)
    assert b"^[]0;pwned^G" in written, (what, written)


def test_hostile_output_is_shown_visibly_on_a_terminal(cli: Cli) -> None:
    seed(cli)
    for args in (("jobs", "list"), ("jobs", "show", IDS["failed"]),
                 ("jobs", "result", IDS["done"]), ("jobs", "result", "--raw", IDS["done"]),
                 ("jobs", "tail", IDS["done"]), ("jobs", "tail", "--raw", IDS["done"]),
                 ("jobs", "tail", "-f", IDS["done"])):
        written, _err = on_a_terminal(cli, *args)
        assert_shown_not_obeyed(written, " ".join(args))
    written, _err = on_a_terminal(cli, "jobs", "result", "--raw", IDS["done"])
    assert b"c1<9b>31m" in written  # the C1 CSI, U+009B
    _written, err = on_a_terminal(cli, "jobs", "result", IDS["failed"])
    for sequence in OBEYED:
        assert sequence.decode(errors="replace") not in err, (sequence, err)
    assert "^[]0;pwned^G" in err


def test_raw_json_and_answers_through_a_pipe_stay_byte_exact(cli: Cli) -> None:
    seed(cli)
    raw = subprocess.run(cli.argv("jobs", "result", "--raw", IDS["done"]), capture_output=True,
                         env=hermetic_env(cli.home), timeout=CLI_TIMEOUT_S, check=False)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == RAW_STDOUT
    answer = subprocess.run(cli.argv("jobs", "result", IDS["done"]), capture_output=True,
                            env=hermetic_env(cli.home), timeout=CLI_TIMEOUT_S, check=False)
    assert answer.stdout == HOSTILE.encode() + b"\n"
    listed = cli.run("jobs", "list", "--json")
    assert {job["prompt"] for job in json.loads(listed.stdout)} == {HOSTILE}


def test_run_shows_a_hostile_answer_visibly_on_a_terminal(sqlite_cli: Cli) -> None:
    """`run`'s answer is the fake CLI's echo of the prompt, escapes and all."""
    written, err = on_a_terminal(sqlite_cli, "run", "claude", HOSTILE)
    assert "completed" in err, err
    assert_shown_not_obeyed(written, "run")


def test_the_visible_writer_keeps_text_whole_and_shows_stray_bytes() -> None:
    """A stream cut mid-character is reassembled; a byte that is not UTF-8 (a raw 8-bit
    CSI) is shown as `<9b>`; newlines and tabs pass."""
    sink = io.BytesIO()
    writer = VisibleWriter(sink)
    encoded = "wörld\x1b[2J\t\n".encode()
    for at in range(len(encoded)):  # one byte at a time
        writer.write(encoded[at:at + 1])
    writer.write(b"\x9b31m\n")
    assert sink.getvalue() == "wörld^[[2J\t\n<9b>31m\n".encode()
    assert visible("\u202egnp.exe \x7f") == "<U+202E>gnp.exe ^?"
