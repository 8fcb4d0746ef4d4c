"""The adapters against the real claude, codex and gemini CLIs (npm), with no account and no
network.

- Every argv an adapter builds is accepted by the real argument parser, for every option
  value: the run gets past parsing to the point where it needs an account (claude: the
  "Not logged in" result; gemini: exit 41 "Please set an Auth method"; codex: it starts a
  thread and tries to reach the API). A negative control shows the same CLIs refuse an
  unknown flag, so "got past parsing" means something.
- Their real not-logged-in failures are recognised, and through the job manager they come
  back as error_kind=auth with the provider's login hint.
- Timeout and cancel stop a real codex (which retries forever without network) and leave
  no process of its group running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from gateway.config import load_settings
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.run.runner import ProcessRun
from gateway.jobs.run.spec import RunSpec
from gateway.model import ErrorKind, JobStatus
from gateway.runtime import Gateway
from providers.base import Invocation
from tests.children import reap
from tests.fakes.argv_cases import covering_cases, provider, request
from tests.waiting import scaled, wait_until

pytestmark = pytest.mark.realcli

RUN_TIMEOUT_S = scaled(60)  # one real run: claude ~1 s, gemini ~2 s, slower on a busy 2-core box
WAIT_S = scaled(30)  # bound on waiting for a condition (codex's first event, a rollout file)
POLL_S = 0.05
PARALLEL_RUNS = 3  # real CLIs are heavy (node, a native binary); 3 at once on 2 cores
CODEX_TIMEOUT_S = scaled(3.0)  # wall clock for the timeout test: codex is still retrying by then
# (scaled: on a busy box codex takes longer than 3 s to print its first event, and a run
# ended before it had would leave the test waiting for an event that never comes)
KILL_GRACE_S = 2.0


def run_real(invocation: Invocation, env: dict[str, str], cwd: Path,
             ) -> subprocess.CompletedProcess[bytes]:
    stdin = invocation.stdin
    return subprocess.run(invocation.argv, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, env={**env, **invocation.env}, cwd=cwd,
                          timeout=RUN_TIMEOUT_S, check=False)


def in_parallel(fn: Callable[[Any], Any], cases: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        return list(pool.map(fn, cases))


def option_cases(name: str) -> list[dict[str, Any]]:
    """Every value of every option (and a model) at least once, in as few runs as possible:
    each real run costs a second or two of CPU."""
    return covering_cases(provider(name))


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def explain(invocation: Invocation, done: subprocess.CompletedProcess[bytes]) -> str:
    return (f"{invocation.argv} exit {done.returncode}\nstdout: {done.stdout[-600:]!r}\n"
            f"stderr: {done.stderr[-600:]!r}")


# -- negative control: the real parsers refuse what they do not know -------------------------


def test_the_real_parsers_refuse_an_unknown_flag(
    real_cli: Callable[[str], str], cli_env: dict[str, str], tmp_path: Path,
) -> None:
    expectations = {
        "claude": (["--print", "--bogus-flag"], b"error: unknown option '--bogus-flag'"),
        "codex": (["exec", "--bogus-flag", "--", "-"],
                  b"error: unexpected argument '--bogus-flag'"),
        "gemini": (["--bogus-flag", "--prompt=hi"], b"Unknown arguments: bogus-flag"),
    }
    for binary, (args, message) in expectations.items():
        done = run_real(Invocation(argv=[real_cli(binary), *args], stdin=b"hi"), cli_env,
                        tmp_path)
        assert done.returncode != 0, binary
        assert message in done.stderr, (binary, done.stderr[-500:])
        name = "gemini" if binary == "gemini" else binary
        assert not provider(name).is_auth_error(done.stdout, done.stderr, done.returncode)


# -- every argv gets past the real parser ---------------------------------------------------


def test_real_claude_accepts_every_argv_the_adapter_builds(
    real_cli: Callable[[str], str], cli_env: dict[str, str], tmp_path: Path,
) -> None:
    claude = provider("claude")
    command = real_cli("claude")

    def one(case: dict[str, Any]) -> tuple[Invocation, subprocess.CompletedProcess[bytes]]:
        invocation = claude.build_invocation(
            request(claude, case["options"], prompt="-p --model x hi", model=case.get("model"),
                    session_id=case.get("session_id")), command)
        return invocation, run_real(invocation, cli_env, tmp_path)

    results = in_parallel(one, option_cases("claude"))
    # Resume the session a first run created (same HOME and working dir, as a user would).
    _, first = results[0]
    session = claude.parse_output(first.stdout, first.stderr, first.returncode).session_id
    assert session
    results.append(one({"options": {"output_format": "json"}, "session_id": session}))
    for invocation, done in results:
        assert done.returncode == 1, explain(invocation, done)
        assert claude.is_auth_error(done.stdout, done.stderr, done.returncode), \
            explain(invocation, done)
        parsed = claude.parse_output(done.stdout, done.stderr, done.returncode)
        assert parsed.is_error is True
        assert parsed.text == "Not logged in \u00b7 Please run /login", explain(invocation, done)
    resumed = claude.parse_output(results[-1][1].stdout, b"", 1)
    assert resumed.session_id == session


def _start_codex(invocation: Invocation, env: dict[str, str], cwd: Path,
                 out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as stdout, open(f"{out}.err", "wb") as stderr:
        process = subprocess.Popen(invocation.argv, stdin=subprocess.PIPE, stdout=stdout,
                                   stderr=stderr, env={**env, **invocation.env},
                                   cwd=cwd, start_new_session=True)
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a codex that refused its argv exits at once
        process.stdin.write(invocation.stdin or b"")
        process.stdin.close()
    return process


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    reap(process, grace_s=WAIT_S)  # its stdin too: left open when the prompt's write failed


def _codex_thread(out: Path) -> str | None:
    """The session id codex printed so far; None also before the supervisor, which starts
    the CLI just after start() returned, has created the stdout file."""
    if not out.exists():
        return None
    return provider("codex").parse_output(out.read_bytes(), b"", None).session_id


def test_real_codex_accepts_every_argv_the_adapter_builds(
    real_cli: Callable[[str], str], cli_env: dict[str, str], tmp_path: Path, real_home: Path,
) -> None:
    codex = provider("codex")
    command = real_cli("codex")

    def one(numbered: tuple[int, dict[str, Any]]) -> tuple[Invocation, str | None, bytes]:
        number, case = numbered
        invocation = codex.build_invocation(
            request(codex, case["options"], prompt="-p --model x hi", model=case.get("model"),
                    session_id=case.get("session_id")), command)
        out = tmp_path / f"codex-{number}.out"
        process = _start_codex(invocation, cli_env, tmp_path, out)
        try:
            # Past the parser, codex opens a thread, then retries the unreachable API.
            wait_until(lambda: _codex_thread(out) or process.poll() is not None,
                       f"codex to start a thread: {invocation.argv}")
            if case.get("wait_for_rollout"):
                # This run's own rollout (the cases run in parallel under one HOME), with its
                # whole first line: killed before that, codex finds no session to resume.
                thread = _codex_thread(out)
                wait_until(lambda: any(b"\n" in p.read_bytes() for p in
                                       (real_home / ".codex").rglob(f"rollout-*{thread}.jsonl")),
                           "codex to write its session rollout")
        finally:
            _stop_group(process)
        return invocation, _codex_thread(out), out.read_bytes()

    cases = option_cases("codex")
    cases[0] = {**cases[0], "wait_for_rollout": True}
    results = in_parallel(one, list(enumerate(cases)))
    for invocation, thread, stdout in results:
        assert thread, f"{invocation.argv}: no thread.started\n{stdout[-500:]!r}"
    # Resume the first run's session: codex reopens that very thread.
    first_thread = results[0][1]
    _, resumed, stdout = one((len(cases), {"options": {"sandbox": "read-only"},
                                           "session_id": first_thread}))
    err = (tmp_path / f"codex-{len(cases)}.out.err").read_bytes()
    assert resumed == first_thread, (stdout[-500:], err[-2000:])


def test_real_gemini_accepts_every_argv_the_adapter_builds(
    real_cli: Callable[[str], str], cli_env: dict[str, str], tmp_path: Path,
) -> None:
    gemini = provider("gemini")
    command = real_cli("gemini")  # named gemini: the adapter builds Google's Gemini CLI argv

    def one(case: dict[str, Any]) -> tuple[Invocation, subprocess.CompletedProcess[bytes]]:
        invocation = gemini.build_invocation(
            request(gemini, case["options"], prompt="-p --model x hi", model=case.get("model"),
                    session_id=case.get("session_id")), command)
        return invocation, run_real(invocation, cli_env, tmp_path)

    for invocation, done in in_parallel(one, option_cases("gemini")):
        assert done.returncode == 41, explain(invocation, done)
        assert gemini.is_auth_error(done.stdout, done.stderr, done.returncode)
    # Without an account there is no session to resume; the lookup still proves parsing.
    invocation, done = one({"options": {}, "session_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"})
    assert done.returncode == 42, explain(invocation, done)
    assert b"Error resuming session" in done.stderr


# -- real auth failures through the job manager ------------------------------------------------


async def _run_through_gateway(tmp_path: Path, provider_name: str, command: str,
                               options: dict[str, Any] | None = None) -> Any:
    settings = load_settings(
        persistence={"backend": "sqlite", "path": str(tmp_path / "state" / "jobs.db")},
        providers={provider_name: {"command": command}},
    )
    gateway = Gateway(settings)
    with anyio.fail_after(RUN_TIMEOUT_S):
        await gateway.start()
    try:
        manager = await gateway.manager()
        with anyio.fail_after(RUN_TIMEOUT_S):
            submission = await manager.submit(
                provider_name, SubmitRequest(prompt="hello", options=options or {}))
            return await manager.reads.wait(submission.job.id, RUN_TIMEOUT_S)
    finally:
        with anyio.fail_after(RUN_TIMEOUT_S):
            await gateway.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("binary", ["claude", "gemini"])
async def test_real_auth_failures_come_back_as_error_kind_auth_with_the_login_hint(
    binary: str, real_cli: Callable[[str], str], real_home: Path, tmp_path: Path,
) -> None:
    row = await _run_through_gateway(tmp_path, binary, real_cli(binary))
    assert row.status == JobStatus.FAILED
    assert row.error_kind == ErrorKind.AUTH
    assert row.error is not None and row.error.startswith(provider(binary).login_hint)
    assert row.exit_code == (41 if binary == "gemini" else 1)


# -- timeout and cancel stop a real codex ------------------------------------------------------


def _codex_spec(tmp_path: Path, command: str, name: str, timeout_s: float) -> RunSpec:
    codex = provider("codex")
    invocation = codex.build_invocation(request(codex, {}, prompt="hello"), command)
    (tmp_path / name).mkdir()  # the manager makes a run's spool dir before its launch
    return RunSpec(job_id=name, invocation=invocation, spool_dir=tmp_path / name,
                   working_dir=str(tmp_path), timeout_s=timeout_s, idle_timeout_s=None,
                   max_output_bytes=10_000_000, kill_grace_s=KILL_GRACE_S,
                   secret_env=frozenset(), install_hint=codex.install_hint)


@pytest.mark.anyio
async def test_timeout_and_cancel_stop_a_real_codex_with_nothing_left_running(
    real_cli: Callable[[str], str], real_home: Path, tmp_path: Path,
) -> None:
    command = real_cli("codex")

    # Wall-clock timeout: codex never finishes without network; the runner ends it.
    timed = ProcessRun(_codex_spec(tmp_path, command, "timed", CODEX_TIMEOUT_S))
    identity = await timed.start()
    with anyio.fail_after(WAIT_S):
        while not _codex_thread(timed.stdout_path):
            await anyio.sleep(POLL_S)
    members = group_members(identity.pgid)
    assert len(members) >= 2  # the node launcher and the native codex binary
    with anyio.fail_after(CODEX_TIMEOUT_S + KILL_GRACE_S + WAIT_S):
        outcome = await timed.wait()
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert outcome.exit_code == 124
    assert group_members(identity.pgid) == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                   != psutil.STATUS_ZOMBIE for pid in members)

    # Cancel: stop it once it has started its thread.
    cancelled = ProcessRun(_codex_spec(tmp_path, command, "cancelled", RUN_TIMEOUT_S))
    identity = await cancelled.start()
    with anyio.fail_after(WAIT_S):
        while not _codex_thread(cancelled.stdout_path):
            await anyio.sleep(POLL_S)
    members = group_members(identity.pgid)
    cancelled.cancel()
    with anyio.fail_after(KILL_GRACE_S + WAIT_S):
        outcome = await cancelled.wait()
    assert outcome.error_kind == ErrorKind.CANCELLED
    assert group_members(identity.pgid) == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status()
                   != psutil.STATUS_ZOMBIE for pid in members)
    parsed = provider("codex").parse_output(cancelled.stdout_path.read_bytes(), b"", None)
    assert parsed.session_id and parsed.extra.get("incomplete") is True
