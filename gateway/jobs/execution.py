"""One run of a job, whatever its transport: a process group or an HTTP API call.

The manager drives both through the same four calls (start, wait, cancel, progress reads),
so there is one job path for every provider.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from gateway.childenv import secret_env_names
from gateway.config import Settings
from gateway.jobs.run.runner import ProcessRun
from gateway.jobs.run.spec import ProcessIdentity, RunSpec
from gateway.jobs.run.spool import clean_stdout_path, read_tail, stderr_path, stdout_path
from gateway.jobs.targets import CliLaunch, CliTarget, HttpTarget, Target
from gateway.jobs.worktrees.create import WorktreeError, create_worktree
from gateway.jobs.worktrees.finish import settle_worktree
from gateway.model import (
    EXIT_CODES,
    OUTPUT_CHUNK_BYTES,
    ErrorKind,
    GatewayError,
    OutputFile,
)
from providers.base import ProviderResult
from providers.parsing import Stdout, plain_text

STDERR_TAIL_BYTES = 8 * 1024  # the end of stderr kept on the row (errors, auth detection)
# Output up to this size is parsed on the event loop: a fraction of a millisecond, less than
# the thread hop it saves on the path of every short request. Larger output gets a thread.
INLINE_PARSE_BYTES = 64 * 1024


@dataclass(slots=True)
class ExecutionOutcome:
    exit_code: int | None
    error_kind: ErrorKind | None
    error: str | None
    output: str | OutputFile  # final stdout (capped); a process's stays in its file
    stderr_tail: str
    output_bytes: int
    truncated: bool
    duration_s: float
    result: ProviderResult | None
    auth_error: bool = False
    # The parsed answer is the output's bytes [start, end): stored as this range instead of
    # a second copy of the text (result.text is then empty).
    answer_span: tuple[int, int] | None = None
    ended_at: float | None = None  # epoch s: when the run ended (a supervisor's record)


class Execution(Protocol):
    async def start(self) -> ProcessIdentity | None: ...

    async def wait(self) -> ExecutionOutcome:
        """Returns when the run is over (for a process: when its whole group is gone)."""

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None: ...

    def detach(self) -> None:
        """The gateway leaves: stop watching, kill nothing (a supervised run goes on)."""

    @property
    def stdout_bytes(self) -> int: ...

    def read_stdout_tail(self, max_bytes: int) -> str: ...

    def read_stderr_tail(self, max_bytes: int) -> str: ...


# What makes a job's run: build_execution below; the unit tests pass a fake (no process).
Launcher = Callable[[Target, str, Path, float, Settings], Execution]


def build_execution(target: Target, job_id: str, spool_dir: Path, timeout_s: float,
                    settings: Settings) -> Execution:
    """A new run of a job's target. Raises GatewayError(launch_failed) for a CLI target
    rebuilt only to finalize an adopted run: it has no argv to start (the manager never
    launches an adopted job, so that is a bug, reported instead of run)."""
    if isinstance(target, HttpTarget):
        return HttpExecution(target, timeout_s)
    if isinstance(target, CliLaunch):
        return ProcessExecution.launch(target, job_id, spool_dir, timeout_s, settings)
    raise GatewayError(ErrorKind.LAUNCH_FAILED,
                       f"job {job_id} cannot be launched here: its {target.provider} target "
                       f"was rebuilt only to finalize a run another gateway started.")


class ProcessExecution:
    def __init__(self, target: CliTarget, run: ProcessRun, settings: Settings) -> None:
        self.target = target
        self.settings = settings
        self.spec = run.spec
        self.run = run

    @classmethod
    def launch(cls, target: CliLaunch, job_id: str, spool_dir: Path, timeout_s: float,
               settings: Settings) -> ProcessExecution:
        """A new run of the target's invocation (started by `start`)."""
        limits = settings.limits
        spec = RunSpec(
            job_id=job_id, invocation=target.invocation, spool_dir=spool_dir,
            working_dir=target.working_dir, timeout_s=timeout_s,
            idle_timeout_s=limits.idle_timeout_s if target.idle_timeout else None,
            max_output_bytes=limits.max_output_bytes, kill_grace_s=limits.kill_grace_s,
            provider_nice=limits.provider_nice,
            secret_env=secret_env_names(settings), install_hint=target.install_hint,
        )
        return cls(target, ProcessRun(spec), settings)

    @classmethod
    def attach(cls, target: CliTarget, spec: RunSpec, identity: ProcessIdentity,
               settings: Settings) -> ProcessExecution:
        """Drive a run another gateway started (the spec is the one it wrote): finalized
        exactly as its owner would."""
        return cls(target, ProcessRun.attach(spec, identity), settings)

    @property
    def identity(self) -> ProcessIdentity | None:
        return self.run.identity

    def detach(self) -> None:
        self.run.detach()

    async def start(self) -> ProcessIdentity:
        plan = self.target.worktree
        if plan is not None:
            # The isolated job's worktree, made and verified first; the CLI runs there and
            # nowhere else: a failure ends the job (worktree_error) with nothing started.
            try:
                cwd = await asyncio.to_thread(create_worktree, self.settings, plan)
            except WorktreeError as exc:
                raise GatewayError(ErrorKind.WORKTREE_ERROR, f"The job's git worktree could "
                                   f"not be made, so its CLI was not started: {exc}") from None
            self.spec.working_dir = str(cwd)
        try:
            # The runner creates the spool dir itself, off the event loop.
            return await self.run.start()
        except GatewayError:
            # Nothing ran in the worktree: it and its branch go (nothing changed).
            await settle_worktree(plan, self.spec.job_id, "not started")
            raise

    async def wait(self) -> ExecutionOutcome:
        outcome = await self.run.wait()
        adapter = self.target.adapter
        options = self.target.options

        def read_and_parse() -> tuple[FinalStdout, str, ProviderResult, bool]:
            # stdout can be max_output_bytes: it stays in its spool file. The adapter reads
            # it in bounded passes, and the row gets it from the file, piece by piece.
            stdout = Stdout(outcome.stdout_path)
            stderr_tail = read_tail(outcome.stderr_path, STDERR_TAIL_BYTES)
            stderr = stderr_tail.encode("utf-8")
            auth = adapter.is_auth_error(stdout, stderr, outcome.exit_code)
            result = adapter.parse_stream(stdout, stderr, outcome.exit_code, options)
            final = final_stdout(outcome.stdout_path, plain_answer=result.answer_is_stdout)
            if result.answer_is_stdout and final.answer_span is None and final.escape:
                # ANSI codes in a plain-text answer: it is not a range of the output, so it
                # is the one case held as text (rare: the CLIs run with NO_COLOR=1).
                result.text = plain_text(Stdout(final.file.path).read())
            result.answer_is_stdout = False
            return final, stderr_tail, result, auth

        if outcome.stdout_bytes + outcome.stderr_bytes <= INLINE_PARSE_BYTES:
            final, stderr_tail, result, auth = read_and_parse()
        else:  # off the event loop: passes over up to max_output_bytes of output
            final, stderr_tail, result, auth = await asyncio.to_thread(read_and_parse)
        return ExecutionOutcome(
            exit_code=outcome.exit_code, error_kind=outcome.error_kind, error=outcome.error,
            output=final.file, stderr_tail=stderr_tail,
            output_bytes=outcome.stdout_bytes, truncated=outcome.truncated,
            duration_s=outcome.duration_s, result=result, answer_span=final.answer_span,
            auth_error=auth and outcome.error_kind in (None, ErrorKind.PROVIDER_ERROR),
            ended_at=outcome.ended_at,
        )

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None:
        self.run.cancel(reason, grace_s=grace_s)

    @property
    def stdout_bytes(self) -> int:
        return self.run.stdout_bytes

    def read_stdout_tail(self, max_bytes: int) -> str:
        return read_tail(stdout_path(self.spec.spool_dir), max_bytes)

    def read_stderr_tail(self, max_bytes: int) -> str:
        return read_tail(stderr_path(self.spec.spool_dir), max_bytes)


class HttpExecution:
    """An HTTP API call as a job run: cancel aborts the request (the task is cancelled)."""

    def __init__(self, target: HttpTarget, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._bytes = 0
        self._task: asyncio.Task[ProviderResult] | None = None
        self._reason: ErrorKind | None = None
        self._started = time.monotonic()

    def _on_progress(self, n: int) -> None:
        self._bytes = n

    async def start(self) -> None:
        # The HTTP stack: a command that reads the store (the finalizer) never loads it.
        from gateway.jobs.http_call import call_normalized  # deferred: start-up

        self._started = time.monotonic()
        self._task = asyncio.create_task(
            call_normalized(self.target.provider, self.target.api_config,
                            self.target.normalized, on_progress=self._on_progress),
            name=f"http-{self.target.provider}")

    async def wait(self) -> ExecutionOutcome:
        assert self._task is not None
        kind: ErrorKind | None = None
        error: str | None = None
        result: ProviderResult | None = None
        try:
            result = await asyncio.wait_for(asyncio.shield(self._task), self.timeout_s)
        except TimeoutError:
            self._task.cancel()
            kind, error = ErrorKind.TIMEOUT, f"No answer within timeout_s={self.timeout_s:g} s."
        except asyncio.CancelledError:
            if self._reason is None:
                raise
            kind = self._reason
            error = "Cancelled by the caller." if kind == ErrorKind.CANCELLED else \
                "The gateway shut down before the API answered."
        except GatewayError as exc:
            kind, error = exc.kind, exc.message
        with contextlib.suppress(BaseException):
            await self._task
        text = result.text if result else ""
        size = len(text.encode("utf-8"))
        if result is not None and size:
            result.text = ""  # the answer is the output: stored once, as its whole range
        return ExecutionOutcome(
            exit_code=0 if kind is None else EXIT_CODES.get(kind, 1), error_kind=kind,
            error=error, output=text, stderr_tail="", output_bytes=size,
            truncated=False, duration_s=time.monotonic() - self._started, result=result,
            answer_span=(0, size) if result is not None and size else None,
            auth_error=kind == ErrorKind.AUTH)

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None:
        if self._task is not None and not self._task.done():
            self._reason = reason
            self._task.cancel()

    def detach(self) -> None:
        """An API call has no process to outlive the gateway: it gets the drain time, and
        what is left is re-queued by the next gateway (its request is stored)."""

    @property
    def stdout_bytes(self) -> int:
        return self._bytes

    def read_stdout_tail(self, max_bytes: int) -> str:
        return ""

    def read_stderr_tail(self, max_bytes: int) -> str:
        return ""


# -- the final stdout as the row stores it -----------------------------------------------------


@dataclass(slots=True)
class FinalStdout:
    file: OutputFile  # the output the row stores: valid UTF-8
    answer_span: tuple[int, int] | None  # where the plain-text answer is in it (None: empty)
    escape: bool  # ANSI codes: the plain-text answer is not a range of the output


def final_stdout(spool: Path, plain_answer: bool) -> FinalStdout:
    """The output the row stores, found in bounded passes over the spool file.

    One pass checks that stdout is UTF-8 (the row's text must be) and, when the answer is
    stdout as plain text, where that text is. Output that is not UTF-8 gets a second pass
    that writes a copy beside the spool file with each bad sequence replaced by U+FFFD,
    exactly as decoding the whole would.
    """
    try:
        return _stdout_pass(spool, "strict", None, plain_answer)
    except UnicodeDecodeError:
        clean = clean_stdout_path(spool)
        with clean.open("wb") as copy:
            final = _stdout_pass(spool, "replace", copy, plain_answer)
        return FinalStdout(OutputFile(clean, final.file.size), final.answer_span, final.escape)


def _stdout_pass(spool: Path, errors: str, copy: BinaryIO | None,
                 plain_answer: bool) -> FinalStdout:
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    answer = _PlainAnswer() if plain_answer else None
    size = 0

    def take(text: str) -> None:
        nonlocal size
        if copy is None and answer is None:
            return
        data = text.encode("utf-8")
        if copy is not None:
            copy.write(data)
        if answer is not None:
            answer.add(text, size, len(data))
        size += len(data)

    with contextlib.suppress(FileNotFoundError), spool.open("rb") as fh:
        while chunk := fh.read(OUTPUT_CHUNK_BYTES):
            take(decoder.decode(chunk))
    take(decoder.decode(b"", final=True))
    if copy is None and answer is None:
        size = spool.stat().st_size if spool.exists() else 0
    return FinalStdout(OutputFile(spool, size), answer.span() if answer else None,
                       bool(answer and answer.escape))


class _PlainAnswer:
    """Where plain_text(stdout) lies in the output, read piece by piece: after the leading
    newlines, up to the end of the last non-blank character (plain_text strips "\n" from
    both ends, then any trailing whitespace)."""

    def __init__(self) -> None:
        self.start = 0
        self.end = 0
        self.leading = True
        self.escape = False

    def add(self, text: str, offset: int, size: int) -> None:
        """`text` is the output's next piece: `size` bytes from byte `offset`."""
        self.escape = self.escape or "\x1b" in text
        if self.leading:
            body = text.lstrip("\n")
            self.start += len(text) - len(body)  # newlines: one byte per character
            self.leading = not body
        kept = text.rstrip()
        if kept:
            self.end = offset + size - len(text[len(kept):].encode("utf-8"))

    def span(self) -> tuple[int, int] | None:
        if self.escape or self.end <= self.start:
            return None
        return self.start, self.end
