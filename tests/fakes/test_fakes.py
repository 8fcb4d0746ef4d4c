"""The fake CLIs behave like the real ones for everything the adapters do, and obey the
directives the job tests rely on (protocol: tests/fakes/README.md).

These run the fakes as real processes (they are the only doubles the project allows, so
they must be right): every option value of every adapter, unknown flags, the round trip
build_invocation -> fake -> parse_output, and each directive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from providers.base import Invocation
from tests.children import Children
from tests.fakes.argv_cases import (
    DIALECTS,
    FAKES_BIN,
    FAKES_DIR,
    provider,
    request,
    single_option_sets,
)
from tests.waiting import scaled, wait_until

RUN_TIMEOUT_S = scaled(20)  # one fake run; they answer in well under a second
WAIT_S = scaled(10)  # bound on every wait for a condition
POLL_S = 0.01
PARALLEL_RUNS = 4  # fakes are I/O-light; a few at once keeps the suite fast on 2 cores
SESSION = "0199a213-81c0-7800-8aa1-bbab2a035a53"
STREAMING = {("claude", "claude"), ("codex", "codex"), ("grok", "grok")}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The child env: the running interpreter's directory first (so `env python3` is this
    Python, not a slow shim), the fakes, a private HOME and a spawn log."""
    (tmp_path / "home").mkdir()
    path = os.pathsep.join([str(Path(sys.executable).parent), str(FAKES_BIN),
                            os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "HOME": str(tmp_path / "home"),
            "FAKE_CLI_LOG": str(tmp_path / "fake.log"), "NO_COLOR": "1"}


def build(name: str, binary: str, options: dict[str, Any] | None = None, **kw: Any) -> Invocation:
    adapter = provider(name)
    return adapter.build_invocation(request(adapter, options or {}, **kw), str(FAKES_BIN / binary))


def run(invocation: Invocation, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    stdin = invocation.stdin
    return subprocess.run(invocation.argv, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=RUN_TIMEOUT_S,
                          env={**env, **invocation.env}, check=False)


def answer(name: str, prompt: str) -> str:
    return f"fake-{name} answer: {prompt}"


def log_entries(env: dict[str, str]) -> list[dict[str, Any]]:
    path = Path(env["FAKE_CLI_LOG"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def spawned(children: Children) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The fakes a test started, each the leader of a group: every group killed afterwards,
    whatever happened (a grandchild outlives its leader), then each leader reaped."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        children.track(process)


def start(invocation: Invocation, env: dict[str, str], out: Path,
          started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    # stderr to a file as well: a pipe nobody reads fills up and blocks the fake.
    with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
        process = subprocess.Popen(
            invocation.argv, stdin=subprocess.DEVNULL if invocation.stdin is None
            else subprocess.PIPE, stdout=stdout, stderr=stderr,
            env={**env, **invocation.env}, start_new_session=True)
    started.append(process)
    if process.stdin is not None:  # the prompt (devin reads it as its --prompt-file)
        process.stdin.write(invocation.stdin or b"")
        process.stdin.close()
    return process


def ignores(pid: int, signum: int) -> bool:
    """The kernel's own record: is `signum` in the process's ignored set (SigIgn)?"""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except FileNotFoundError:
        return False
    return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- argv: every option value is accepted, unknown flags are refused ------------------------


def _cases(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = [{"options": o} for o in single_option_sets(provider(name))]
    return [*cases, {"options": {}, "session_id": SESSION}, {"options": {}, "model": "m-1"}]


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_each_fake_accepts_the_adapters_argv_for_every_option_value(
    name: str, binary: str, env: dict[str, str],
) -> None:
    prompt = "-p --model x say hi"

    def one(case: dict[str, Any]) -> tuple[dict[str, Any], Invocation, Any]:
        invocation = build(name, binary, case["options"], prompt=prompt,
                           session_id=case.get("session_id"), model=case.get("model"))
        return case, invocation, run(invocation, env)

    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        results = list(pool.map(one, _cases(name)))
    for case, invocation, done in results:
        assert done.returncode == 0, (invocation.argv, done.stderr.decode())
        options = provider(name).options_model.model_validate(case["options"])
        parsed = provider(name).parse_output(done.stdout, done.stderr, 0, options)
        assert parsed.text == answer(name, prompt), invocation.argv
        assert parsed.is_error is False


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_each_fake_rejects_an_unknown_flag_like_the_real_cli(
    name: str, binary: str, env: dict[str, str],
) -> None:
    invocation = build(name, binary)
    at = 2 if name == "codex" else 1
    invocation.argv[at:at] = ["--no-such-flag"]
    done = run(invocation, env)
    assert done.returncode == 2
    assert b"error: unknown option '--no-such-flag'" in done.stderr
    assert done.stdout == b""
    assert log_entries(env) == []


@pytest.mark.parametrize(("name", "binary", "flag", "value"), [
    ("claude", "claude", "--permission-mode", "yolo"),
    ("codex", "codex", "--sandbox", "none"),
    ("grok", "grok", "--output-format", "stream-json"),
    ("gemini", "gemini", "--approval-mode", "auto-edit"),
])
def test_fakes_refuse_a_value_the_real_help_does_not_allow(
    name: str, binary: str, flag: str, value: str, env: dict[str, str],
) -> None:
    invocation = build(name, binary)
    at = 2 if name == "codex" else 1
    invocation.argv[at:at] = [flag, value]
    done = run(invocation, env)
    assert done.returncode == 2
    assert f"option '{flag}' argument '{value}' is invalid".encode() in done.stderr


# -- round trip -----------------------------------------------------------------------------

SESSION_REPORTING: list[tuple[str, str, dict[str, Any]]] = [
    ("claude", "claude", {}), ("claude", "claude", {"output_format": "json"}),
    ("codex", "codex", {}), ("gemini", "agy", {"output_format": "json"}),
    ("gemini", "gemini", {"output_format": "json"}), ("grok", "grok", {}),
    ("grok", "grok", {"output_format": "json"}), ("cursor", "cursor-agent", {}),
    ("cursor", "cursor-agent", {"output_format": "stream-json"}),
]


@pytest.mark.parametrize(("name", "binary", "options"), SESSION_REPORTING)
def test_round_trip_gives_the_answer_and_a_session_that_resumes(
    name: str, binary: str, options: dict[str, Any], env: dict[str, str],
) -> None:
    adapter = provider(name)
    first = run(build(name, binary, options, prompt="first question"), env)
    parsed = adapter.parse_output(first.stdout, first.stderr, first.returncode)
    assert parsed.text == answer(name, "first question")
    assert parsed.session_id
    second = run(build(name, binary, options, prompt="follow up",
                       session_id=parsed.session_id), env)
    resumed = adapter.parse_output(second.stdout, second.stderr, second.returncode)
    assert resumed.text == answer(name, "follow up")
    assert resumed.session_id == parsed.session_id


@pytest.mark.parametrize(("name", "binary"), [("mistral", "vibe"), ("devin", "devin")])
def test_round_trip_of_clis_that_report_no_session(
    name: str, binary: str, env: dict[str, str],
) -> None:
    done = run(build(name, binary, prompt="hello"), env)
    parsed = provider(name).parse_output(done.stdout, done.stderr, done.returncode)
    assert (parsed.text, parsed.session_id) == (answer(name, "hello"), None)


def test_usage_round_trips_through_the_fakes(env: dict[str, str]) -> None:
    for name, binary in (("claude", "claude"), ("codex", "codex"), ("grok", "grok")):
        done = run(build(name, binary), env)
        usage = provider(name).parse_output(done.stdout, done.stderr, 0).usage
        assert usage is not None and usage.input_tokens and usage.output_tokens, name


# -- directives -----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_auth_directive_prints_the_clis_not_logged_in_failure(
    name: str, binary: str, env: dict[str, str],
) -> None:
    adapter = provider(name)
    done = run(build(name, binary, prompt="hi @auth"), env)
    assert done.returncode == (41 if binary == "gemini" else 1)
    assert adapter.is_auth_error(done.stdout, done.stderr, done.returncode)
    assert adapter.parse_output(done.stdout, done.stderr, done.returncode).is_error


@pytest.mark.parametrize("output_format", ["text", "json", "stream-json"])
def test_claude_auth_failure_is_recognised_in_every_output_format(
    output_format: str, env: dict[str, str],
) -> None:
    done = run(build("claude", "claude", {"output_format": output_format}, prompt="@auth"), env)
    assert provider("claude").is_auth_error(done.stdout, done.stderr, done.returncode)


def test_a_successful_run_is_never_an_auth_error(env: dict[str, str]) -> None:
    for name, binary in DIALECTS:
        done = run(build(name, binary, prompt="Not logged in · Please run /login"), env)
        assert not provider(name).is_auth_error(done.stdout, done.stderr, done.returncode)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_stream_directive_emits_progress_then_the_answer(
    name: str, binary: str, env: dict[str, str],
) -> None:
    prompt = "go @stream=3:0.01"
    done = run(build(name, binary, prompt=prompt), env)
    assert done.returncode == 0
    output = done.stdout + done.stderr
    assert output.count(b"progress ") == 3
    parsed = provider(name).parse_output(done.stdout, done.stderr, 0)
    assert parsed.text.endswith(answer(name, prompt))
    if (name, binary) in STREAMING:
        assert done.stdout.count(b"progress ") == 3  # in the CLI's own streaming format
        assert parsed.text == answer(name, prompt)


@pytest.mark.parametrize(("name", "binary"), DIALECTS)
def test_bytes_directive_writes_filler_and_the_answer_still_parses(
    name: str, binary: str, env: dict[str, str],
) -> None:
    prompt = "big @bytes=200000"
    done = run(build(name, binary, prompt=prompt), env)
    assert done.returncode == 0
    assert b"x" * 199_999 + b"\n" in done.stdout  # exactly 200000 filler bytes
    parsed = provider(name).parse_output(done.stdout, done.stderr, 0)
    assert parsed.text.endswith(answer(name, prompt))


def test_exit_and_stderr_directives(env: dict[str, str]) -> None:
    prompt = "fail @exit=3 @stderr=something-broke"
    done = run(build("devin", "devin", prompt=prompt), env)
    assert done.returncode == 3
    assert b"something-broke" in done.stderr
    assert answer("devin", prompt).encode() in done.stdout
    assert provider("devin").parse_output(done.stdout, done.stderr, 3).is_error


def test_the_spawn_log_records_each_invocation(env: dict[str, str], tmp_path: Path) -> None:
    invocation = build("codex", "codex", prompt="logged prompt")
    done = subprocess.run(invocation.argv, input=invocation.stdin, capture_output=True,
                          env=env, cwd=tmp_path, timeout=RUN_TIMEOUT_S, check=True)
    [entry] = log_entries(env)
    assert entry["provider"] == "codex"
    assert entry["argv"][1:] == invocation.argv[1:]
    assert entry["prompt"] == "logged prompt"
    assert entry["cwd"] == str(tmp_path)
    assert isinstance(entry["pid"], int) and isinstance(entry["pgid"], int)
    assert isinstance(entry["t"], float)
    assert done.returncode == 0


def test_sleep_directive_holds_the_answer(env: dict[str, str], tmp_path: Path,
                                          spawned: list[subprocess.Popen[bytes]]) -> None:
    out = tmp_path / "out"
    process = start(build("devin", "devin", prompt="@sleep=60 slow"), env, out, spawned)
    wait_until(lambda: log_entries(env), "the fake to start")
    assert process.poll() is None
    assert out.read_bytes() == b""
    process.kill()
    process.wait(WAIT_S)


def test_until_directive_answers_once_its_file_exists(
    env: dict[str, str], tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
) -> None:
    out, go = tmp_path / "out", tmp_path / "go"
    prompt = f"@until={go} held"
    process = start(build("devin", "devin", prompt=prompt), env, out, spawned)
    wait_until(lambda: log_entries(env), "the fake to start")
    assert process.poll() is None
    go.touch()
    assert process.wait(WAIT_S) == 0
    assert out.read_bytes() == f"{answer('devin', prompt)}\n".encode()


def test_ignore_term_survives_sigterm_and_dies_of_sigkill(
    env: dict[str, str], tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
) -> None:
    out = tmp_path / "out"
    process = start(build("devin", "devin", prompt="@ignore-term @stream=400:0.02 x"),
                    env, out, spawned)
    wait_until(lambda: log_entries(env), "the fake to start")
    assert ignores(process.pid, signal.SIGTERM)
    os.killpg(process.pid, signal.SIGTERM)
    seen = out.read_bytes().count(b"progress")
    wait_until(lambda: out.read_bytes().count(b"progress") > seen + 2,
               "progress after SIGTERM")
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(WAIT_S) == -signal.SIGKILL


def test_late_directive_writes_output_on_sigterm_then_exits_143(
    env: dict[str, str], tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
) -> None:
    out = tmp_path / "out"
    process = start(build("devin", "devin", prompt="@late=5000 @sleep=60 x"), env, out, spawned)
    wait_until(lambda: log_entries(env), "the fake to start")
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(WAIT_S) == 143
    assert out.read_bytes().count(b"L") == 4999  # 5000 bytes, the last one a newline


@pytest.mark.parametrize("ignore_term", [False, True])
def test_grandchild_directive_leaves_a_process_in_the_same_group(
    ignore_term: bool, env: dict[str, str], tmp_path: Path, spawned: list[subprocess.Popen[bytes]],
) -> None:
    prompt = "@grandchild=60 " + ("@ignore-term " if ignore_term else "") + "x"
    process = start(build("devin", "devin", prompt=prompt), env, tmp_path / "out", spawned)
    assert process.wait(WAIT_S) == 0
    entries = log_entries(env)
    pgid = next(e["pgid"] for e in entries if "argv" in e)
    grandchild = next(e["grandchild_pid"] for e in entries if "grandchild_pid" in e)
    assert pgid == process.pid
    assert alive(grandchild)
    assert os.getpgid(grandchild) == pgid
    if ignore_term:
        wait_until(lambda: ignores(grandchild, signal.SIGTERM), "the grandchild's SIG_IGN")
        os.killpg(pgid, signal.SIGTERM)
        assert alive(grandchild)
        os.killpg(pgid, signal.SIGKILL)
    else:
        os.killpg(pgid, signal.SIGTERM)
    wait_until(lambda: not alive(grandchild), "the grandchild to die")


def test_the_fakes_import_only_the_standard_library() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import fakecli; "
            "print([m for m, v in sys.modules.items() "
            "if 'site-packages' in (getattr(v, '__file__', '') or '')])")
    done = subprocess.run([sys.executable, "-c", code, str(FAKES_DIR)], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=True)
    assert done.stdout.strip() == "[]"
