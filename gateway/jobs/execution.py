"""One run of a job, whatever its transport: a process group or an HTTP API call.

The manager drives both through the same four calls (start, wait, cancel, progress reads),
so there is one job path for every provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.config import Settings
from gateway.jobs.model import EXIT_CODES, ErrorKind, GatewayError
from gateway.jobs.runner import ProcessIdentity, ProcessRun, RunSpec, read_tail
from gateway.jobs.targets import Target
from providers.base import ProviderResult

STDERR_TAIL_BYTES = 8 * 1024  # the end of stderr kept on the row (errors, auth detection)


@dataclass(slots=True)
class ExecutionOutcome:
    exit_code: int | None
    error_kind: ErrorKind | None
    error: str | None
    output: str  # final stdout (capped)
    stderr_tail: str
    output_bytes: int
    truncated: bool
    duration_s: float
    result: ProviderResult | None
    auth_error: bool = False


class Execution(Protocol):
    async def start(self) -> ProcessIdentity | None: ...

    async def wait(self) -> ExecutionOutcome:
        """Returns when the run is over (for a process: when its whole group is gone)."""

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None: ...

    @property
    def stdout_bytes(self) -> int: ...

    def read_stdout_tail(self, max_bytes: int) -> str: ...

    def read_stderr_tail(self, max_bytes: int) -> str: ...


def build_execution(target: Target, job_id: str, spool_dir: Path, timeout_s: float,
                    settings: Settings) -> Execution:
    if target.transport == "http":
        return HttpExecution(target, timeout_s)
    return ProcessExecution(target, job_id, spool_dir, timeout_s, settings)


class ProcessExecution:
    def __init__(self, target: Target, job_id: str, spool_dir: Path, timeout_s: float,
                 settings: Settings) -> None:
        assert target.invocation is not None and target.adapter is not None
        self.target = target
        limits = settings.limits
        self.spec = RunSpec(
            job_id=job_id, invocation=target.invocation, spool_dir=spool_dir,
            working_dir=target.working_dir, timeout_s=timeout_s,
            idle_timeout_s=limits.idle_timeout_s if target.idle_timeout else None,
            max_output_bytes=limits.max_output_bytes, kill_grace_s=limits.kill_grace_s,
            install_hint=target.install_hint,
        )
        self.run = ProcessRun(self.spec)

    async def start(self) -> ProcessIdentity:
        # The runner creates the spool dir itself, off the event loop.
        return await self.run.start()

    async def wait(self) -> ExecutionOutcome:
        outcome = await self.run.wait()
        adapter = self.target.adapter
        assert adapter is not None
        options = self.target.provider_request.options if self.target.provider_request else None

        def read_and_parse() -> tuple[str, str, ProviderResult, bool]:
            # stdout can be max_output_bytes: it is read once, parsed from those bytes and
            # decoded once, and the bytes are gone when this returns (only the text stays).
            stdout = outcome.stdout_path.read_bytes() if outcome.stdout_path.exists() else b""
            stderr_tail = read_tail(outcome.stderr_path, STDERR_TAIL_BYTES)
            stderr = stderr_tail.encode("utf-8")
            # The auth check first: its scratch copies are freed before the parsed answer
            # (as large as stdout for a plain-text answer) is held, which lowers the peak.
            auth = adapter.is_auth_error(stdout, stderr, outcome.exit_code)
            result = adapter.parse_output(stdout, stderr, outcome.exit_code, options)
            output = stdout.decode("utf-8", errors="replace")
            return output, stderr_tail, result, auth

        # Off the event loop: up to max_output_bytes of output to decode and parse.
        output, stderr_tail, result, auth = await asyncio.to_thread(read_and_parse)
        return ExecutionOutcome(
            exit_code=outcome.exit_code, error_kind=outcome.error_kind, error=outcome.error,
            output=output, stderr_tail=stderr_tail,
            output_bytes=outcome.stdout_bytes, truncated=outcome.truncated,
            duration_s=outcome.duration_s, result=result,
            auth_error=auth and outcome.error_kind in (None, ErrorKind.PROVIDER_ERROR),
        )

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None:
        self.run.cancel(reason, grace_s=grace_s)

    @property
    def stdout_bytes(self) -> int:
        return self.run.stdout_bytes

    def read_stdout_tail(self, max_bytes: int) -> str:
        return read_tail(self.spec.spool_dir / "stdout", max_bytes)

    def read_stderr_tail(self, max_bytes: int) -> str:
        return read_tail(self.spec.spool_dir / "stderr", max_bytes)


class HttpExecution:
    """An HTTP API call as a job run: cancel aborts the request (the task is cancelled)."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._bytes = 0
        self._task: asyncio.Task[ProviderResult] | None = None
        self._reason: ErrorKind | None = None
        self._started = time.monotonic()

    def _on_progress(self, n: int) -> None:
        self._bytes = n

    async def start(self) -> None:
        from providers.http_api import call_api

        assert self.target.api_config is not None
        self._started = time.monotonic()
        self._task = asyncio.create_task(
            call_api(self.target.provider, self.target.api_config, self.target.api_request,
                     on_progress=self._on_progress),
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
        return ExecutionOutcome(
            exit_code=0 if kind is None else EXIT_CODES.get(kind, 1), error_kind=kind,
            error=error, output=text, stderr_tail="", output_bytes=len(text.encode("utf-8")),
            truncated=False, duration_s=time.monotonic() - self._started, result=result,
            auth_error=kind == ErrorKind.AUTH)

    def cancel(self, reason: ErrorKind, grace_s: float | None = None) -> None:
        if self._task is not None and not self._task.done():
            self._reason = reason
            self._task.cancel()

    @property
    def stdout_bytes(self) -> int:
        return self._bytes

    def read_stdout_tail(self, max_bytes: int) -> str:
        return ""

    def read_stderr_tail(self, max_bytes: int) -> str:
        return ""
