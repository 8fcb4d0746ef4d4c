"""The read side of the job path: a job's row, the job list, waiting, and pages of its output.

Reads work for any instance's job and after restarts: the store has the row. One rule says
where a running job's output so far comes from (`live_stdout`): its spool file when it runs
on this host with our state dir and the file can be read, else what its owner flushed to the
row. The manager's result pages and `jobs tail` both follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import Settings
from gateway.jobs.run import spool
from gateway.model import ErrorKind, GatewayError, JobRow, JobStatus
from gateway.store.base import JobStore, StoreUnavailable
from neutral.utf8 import char_boundary

if TYPE_CHECKING:  # `jobs tail` reads with live_stdout and needs none of the job machinery
    from gateway.jobs.local_job import LocalJob

REMOTE_POLL_S = 1.0  # a wait on a job run elsewhere re-reads its row at least this often
DEFAULT_RESULT_PAGE = 200_000
# A stored page is read with this many bytes more on each side: a UTF-8 character is at most
# 4 bytes, so the page's ends can be moved to character boundaries inside what was read.
PAGE_MARGIN_BYTES = 8
# Offsets beyond any output are clamped to this (2**53: exact in JSON, and offset + length
# stays inside SQLite's and PostgreSQL's 64-bit integers).
MAX_RESULT_OFFSET = 2**53

ProgressCallback = Callable[[int, float], Awaitable[None]]  # (output bytes, elapsed s)


@dataclass(slots=True)
class ResultPage:
    job: JobRow
    output: str
    offset: int
    next_offset: int | None
    total_bytes: int
    complete: bool  # the job is terminal and this page reaches the end
    parsed: dict[str, Any] | None  # the parsed result without its text (the pages carry it)


def live_stdout(root: Path, hostname: str, row: JobRow, start: int,
                length: int) -> tuple[bytes, int] | None:
    """`length` bytes from `start` of a running job's stdout, and its size so far, read from
    its spool file (under `root`, the spool root of our state dir) when it runs on this host
    (`hostname`); None when it runs elsewhere or its spool file cannot be read here (gone,
    EACCES, not a file): then what its owner flushed to the row is all there is. Blocking
    file I/O: call it in a thread."""
    if row.hostname != hostname:
        return None
    try:
        return spool.read_range(spool.stdout_path(spool.run_dir(root, row)), start, length)
    except OSError:
        return None


def store_down(exc: StoreUnavailable) -> GatewayError:
    """The one answer for a read or cancel the store could not serve (retryable)."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"The job store is unreachable ({exc}); retry shortly.")


class JobReads:
    """Answers reads for any job; the jobs this instance drives (`local`, by id: read only
    here) answer from memory when the store cannot, and wake a waiter at their end."""

    def __init__(self, settings: Settings, store: JobStore, hostname: str,
                 local: Mapping[str, LocalJob]) -> None:
        self.settings = settings
        self.store = store
        self.hostname = hostname
        self.spool_root = spool.spool_root(settings.state_dir)
        self._local = local

    async def get(self, job_id: str) -> JobRow:
        """The job's row without its output: a light read (the output and the parsed answer
        can be max_output_bytes; status, wait and cancel need neither; read_result pages
        them). result_json comes without its `text`."""
        try:
            row = await self.store.get_job(job_id, with_output=False)
        except StoreUnavailable as exc:
            local = self._local.get(job_id)
            if local is not None:
                return local.row
            raise store_down(exc) from None
        if row is None:
            raise self.not_found(job_id)
        local = self._local.get(job_id)
        if local is not None and row.status.is_active:
            row.output_bytes = max(row.output_bytes, local.output_bytes)
        return row

    def not_found(self, job_id: str) -> GatewayError:
        return GatewayError(ErrorKind.JOB_NOT_FOUND,
                            f"No job with id {job_id!r}. Check the id (llm_job_list shows recent "
                            f"jobs); finished jobs are kept "
                            f"{self.settings.persistence.retention_days:g} days.")

    async def wait_end(self, job_id: str, step_s: float, read: JobRow | None = None,
                       stop: Callable[[], bool] = lambda: False) -> JobRow:
        """Until the job ends or `stop()` says so, re-arming a `wait` of step_s: a watch
        that lasts as long as the job (a session's or a task listener's)."""
        row = await self.wait(job_id, step_s, read=read)
        while row.status.is_active and not stop():
            row = await self.wait(job_id, step_s, read=row)
        return row

    async def wait(self, job_id: str, timeout_s: float,
                   on_progress: ProgressCallback | None = None,
                   read: JobRow | None = None) -> JobRow:
        """Until the job is terminal or timeout_s passed; returns the row either way.
        `read`: the job's row as the caller has just read it (get()), so that a wait on a
        job that has already ended costs one store read, not two.

        A job driven here is awaited on its own completion event (no store polling, so a
        sync request learns of the exit at once); a job run elsewhere is re-read when the
        store tells of a change (PostgreSQL: LISTEN/NOTIFY) and about once a second anyway.
        """
        started = time.monotonic()
        deadline = started + max(0.0, timeout_s)
        row = read if read is not None and read.id == job_id else await self.get(job_id)
        while row.status.is_active:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            local = self._local.get(job_id)
            step = min(remaining, REMOTE_POLL_S)
            if local is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(step):  # no task of its own, unlike wait_for
                        await local.done.wait()
                if local.terminal is not None:  # ended by our own write: that row it is
                    return dataclasses.replace(local.terminal)  # each waiter its own
            else:  # run elsewhere: woken by the store's notice of a change, or the poll
                await self.store.wait_for_change(job_id, step)
            row = await self.get(job_id)
            if on_progress is not None and row.status.is_active:
                await on_progress(row.output_bytes, time.monotonic() - started)
        return row

    async def wait_many(self, rows: Sequence[JobRow], all_of: bool, timeout_s: float,
                        on_progress: ProgressCallback | None = None) -> list[JobRow]:
        """`wait` on several jobs at once (`rows`: each as the caller has just read it):
        until the first of them is terminal (`all_of` False) or all are, or timeout_s
        passed. Returns every job's row, re-read if its waiter was still waiting. Each job
        is awaited as `wait` awaits one (its own end event here, the store's notice or the
        poll for another gateway's), so the first end is seen as soon as a single wait
        would see it."""
        tasks = {asyncio.ensure_future(self.wait(row.id, timeout_s, on_progress, read=row)):
                 row for row in rows}
        ended: dict[str, JobRow] = {}
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    row = task.result()
                    ended[row.id] = row
                if not all_of and any(r.status.is_terminal for r in ended.values()):
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return [ended[row.id] if row.id in ended else await self.get(row.id)
                for row in rows]

    async def list_jobs(self, status: str | None = None, provider: str | None = None,
                        limit: int = 20, principal: str | None = None,
                        unowned_too: bool = False) -> list[JobRow]:
        statuses = None
        if status:
            try:
                statuses = [JobStatus(status)]
            except ValueError:
                raise GatewayError(ErrorKind.INVALID_INPUT,
                                   f"Unknown status {status!r}; use one of "
                                   f"{[s.value for s in JobStatus]}.") from None
        try:
            return await self.store.list_jobs(statuses=statuses, provider=provider, limit=limit,
                                              principal=principal, unowned_too=unowned_too,
                                              with_output=False)
        except StoreUnavailable as exc:
            raise store_down(exc) from None

    async def read_result(self, job_id: str, offset: int = 0,
                          max_bytes: int = DEFAULT_RESULT_PAGE, raw: bool = False,
                          terminal: JobRow | None = None) -> ResultPage:
        """A page of the job's output: the parsed answer text when the provider gave one
        (raw=False), else stdout. Offsets are UTF-8 byte offsets; a page never splits a
        character. Works for any instance's job and after restarts. `terminal`: the job's
        row as the caller just read it, terminal: the page is read without reading it again
        (a sync answer's second store round trip)."""
        if offset < 0 or max_bytes < 1:
            raise GatewayError(ErrorKind.INVALID_INPUT, "offset must be >= 0 and max_bytes >= 1.")
        # Past any output's end (and within every store's 64-bit integers): an empty page.
        offset, max_bytes = min(offset, MAX_RESULT_OFFSET), min(max_bytes, MAX_RESULT_OFFSET)
        if terminal is not None and terminal.id == job_id and terminal.status.is_terminal:
            row = terminal
        else:
            row = await self.get(job_id)
        parsed = json.loads(row.result_json) if row.result_json else None
        upto = offset + max_bytes + PAGE_MARGIN_BYTES
        # Only the page (and a few bytes around it) is read, however large the output or the
        # offset. Stored text is valid UTF-8, so no boundary moves by more than 3 bytes.
        base = max(0, offset - PAGE_MARGIN_BYTES)  # the output position of data[0]
        data: bytes
        if row.status.is_terminal:
            data, total = await self._stored_output(job_id, base, upto - base, answer=not raw)
        else:
            data, total = await self._partial_stdout(row, base, upto - base)
        start = base + char_boundary(data, min(offset, total) - base)
        end = base + char_boundary(data, min(total, start + max_bytes) - base)
        if end == start and start < total:  # max_bytes smaller than one character: take it
            end = min(total, base + char_boundary(data, start + 1 - base, forward=True))
        next_offset = end if end < total else None
        if end >= base + len(data) and end < total:  # a running job's prefix: more is coming
            next_offset = end
        page = data[start - base:end - base].decode("utf-8", errors="replace")
        return ResultPage(job=row, output=page, offset=start, next_offset=next_offset,
                          total_bytes=total, complete=row.status.is_terminal and next_offset is None,
                          parsed=parsed)

    async def _stored_output(self, job_id: str, offset: int, length: int,
                             answer: bool = False) -> tuple[bytes, int]:
        try:
            found = await self.store.read_output(job_id, offset, length, answer=answer)
        except StoreUnavailable as exc:
            raise store_down(exc) from None
        if found is None:
            raise self.not_found(job_id)
        return found

    async def _partial_stdout(self, row: JobRow, base: int, length: int) -> tuple[bytes, int]:
        """Output so far of a running job (`length` bytes from `base`, and the total), by the
        one rule of `live_stdout`."""
        found = await asyncio.to_thread(live_stdout, self.spool_root, self.hostname, row, base,
                                        length)
        return found if found is not None else await self._stored_output(row.id, base, length)
