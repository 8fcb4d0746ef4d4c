"""A job's spool directory: where a provider process writes its output, and how it is read.

The runner points the child's stdout and stderr straight at two files here, the execution
reads their tails for progress and errors, the manager reads a running job's stdout for
result pages and removes the directory once the terminal row holds the output. One module
names the files so that those three never disagree.

Layout: `<state_dir>/spool/<job id>/` holding `stdout`, `stderr` and, when stdout was not
valid UTF-8, `stdout.utf8` (the cleaned copy the row stores), beside the supervisor's
records (`run.json`, `start.json`, `stop.json`, `end.json`: gateway/jobs/run/supervisor.py).
Directories are 0700, files 0600 (the runner creates them).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

from gateway.fs import ensure_private_dir
from gateway.jobs.run import supervisor
from gateway.model import JobRow
from neutral.utf8 import char_boundary

# Less free space than this on the spool's filesystem is a full disk: a provider's next
# write fails (ENOSPC), and the store beside it could not take the output either.
FULL_BELOW_BYTES = 64 * 1024

SPOOL_DIR_NAME = "spool"
# The supervisor writes them (it imports nothing of the gateway, so the names live there).
STDOUT_NAME = supervisor.STDOUT_NAME
STDERR_NAME = supervisor.STDERR_NAME
CLEAN_STDOUT_NAME = "stdout.utf8"  # the copy of a stdout that is not valid UTF-8
# Where a run without a working_dir runs: a fresh 0700 dir outside any repository (no
# project instructions), named in its attempt's `temp_cwd.json` before it is made.
TEMP_DIR_PREFIX = "agent-cli-gateway-run-"
TEMP_CWD_NAME = "temp_cwd.json"


def spool_root(state_dir: Path) -> Path:
    """The directory that holds every job's spool directory."""
    return state_dir / SPOOL_DIR_NAME


def job_dir(root: Path, job_id: str) -> Path:
    """Everything a job spooled, every launch attempt's: one rmtree removes it all."""
    return root / job_id


def run_dir(root: Path, row: JobRow) -> Path:
    """The spool dir of the row's current launch: `<root>/<job id>/<attempt>`.

    Each re-queue (a new `requeued_at`) is a new attempt with a dir of its own. A gateway
    stopped between its queued -> running CAS and its launch can wake after its job was
    re-queued, run by a peer and cleaned up; it only ever looks in its own attempt's dir,
    which the re-queue claimed or removed, and the runner never recreates it, so it cannot
    launch the run a second time (found by the stop chaos run on PostgreSQL). Every
    attempt lives in `job_dir`; a first attempt of the previous release's layout (no
    attempt dir) is read where it is."""
    if row.requeued_at is None:
        legacy = job_dir(root, row.id)
        if (legacy / supervisor.RUN_NAME).is_file() and not (legacy / "0").exists():
            # A run detached by a gateway of 0.1.0 (before 5869058): its records lie in
            # `<root>/<job id>/` itself, and a newer gateway adopts it from there.
            return legacy
        return first_run_dir(root, row.id)
    return job_dir(root, row.id) / f"r{round(row.requeued_at.timestamp() * 1_000_000)}"


def first_run_dir(root: Path, job_id: str) -> Path:
    """The dir of a job's first launch attempt (a new job's `run_dir`)."""
    return job_dir(root, job_id) / "0"


def make_run_dir(path: Path) -> bool:
    """Make a launch attempt's dir (0700) before its queued -> running CAS; True if this call
    made it, so that a refused CAS removes only what it made (issue 23, item 12: a woken
    owner re-made its old attempt's dir and left it)."""
    existed = path.is_dir()
    ensure_private_dir(path)
    return not existed


def discard_run_dir(path: Path) -> None:
    """Remove an attempt's dir that `make_run_dir` made for a launch refused by its CAS, and
    its job's dir if nothing else is in it."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def make_temp_cwd(attempt_dir: Path) -> Path:
    """A fresh private temp dir for a run, its path recorded in the attempt dir *before* it
    is made: a re-queue that finds the run unstarted removes it (`remove_job_dir`); the
    record is the only trace of it (issue 23, item 12). mkdir, like mkdtemp, refuses a name
    that exists, so nobody can hand the run a dir of their choosing. Raises OSError
    (FileNotFoundError: the attempt dir is gone)."""
    while True:
        path = Path(tempfile.gettempdir()) / f"{TEMP_DIR_PREFIX}{secrets.token_hex(8)}"
        supervisor.write_record(attempt_dir, TEMP_CWD_NAME, {"path": str(path)})
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path


def remove_temp_cwd(attempt_dir: Path) -> None:
    """Remove the temp dir an attempt recorded, if any (only one of ours: the prefix)."""
    record = supervisor.read_record(attempt_dir, TEMP_CWD_NAME) or {}
    path = Path(str(record.get("path", "")))
    if path.parent == Path(tempfile.gettempdir()) and path.name.startswith(TEMP_DIR_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def remove_job_dir(root: Path, job_id: str) -> None:
    """Remove a job's spool, and the temp dirs its attempts made: for a re-queue of a job no
    attempt of which started (a started run's supervisor removes its own)."""
    directory = job_dir(root, job_id)
    try:
        attempts = list(directory.iterdir())
    except OSError:
        attempts = []
    for attempt in attempts:
        remove_temp_cwd(attempt)
    shutil.rmtree(directory, ignore_errors=True)


def idle_job_ids(root: Path, idle_s: float, now: float, skip: Collection[str]) -> list[str]:
    """The jobs whose spool nothing has changed for `idle_s` (the job's dir and its attempt
    dirs by mtime: a record or output file that is added or removed changes them), minus
    `skip`: where a sweep looks for spools left behind by a terminal writer that was killed
    between its write and its removal of the spool (the portable chaos run). Oldest first."""
    found: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for directory in root.iterdir():
            if directory.name in skip:
                continue
            with contextlib.suppress(OSError):
                changed = max([directory.stat().st_mtime,
                               *(attempt.stat().st_mtime for attempt in directory.iterdir())])
                if now - changed >= idle_s:
                    found.append((changed, directory.name))
    return [job_id for _, job_id in sorted(found)]


def stdout_path(job_dir: Path) -> Path:
    return job_dir / STDOUT_NAME


def stderr_path(job_dir: Path) -> Path:
    return job_dir / STDERR_NAME


def file_size(path: Path) -> int:
    """A spool file's size now (0 if it is not there yet, or gone): live progress and the
    sizes of a run's outcome."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def clean_stdout_path(stdout: Path) -> Path:
    """Where the cleaned (valid UTF-8) copy of the spool file `stdout` goes."""
    return stdout.with_name(CLEAN_STDOUT_NAME)


def read_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` bytes (at most) of a spool file as text ("" if absent).

    The cut never splits a UTF-8 character: continuation bytes at the start of the window are
    skipped, and an incomplete character at the end (a writer still mid-character) is left
    out. Bytes that are not UTF-8 at all become U+FFFD.
    """
    if max_bytes <= 0:
        return ""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return ""
    if start > 0:
        data = data[char_boundary(data, 0, forward=True):]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data, final=False)


def read_range(path: Path, start: int, length: int) -> tuple[bytes, int]:
    """`length` bytes of a (possibly growing) spool file from `start`, never more than it
    holds however large `length` or `start` is, and the file's size."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(min(start, size))
        data = fh.read(max(0, min(length, size - start)))
    return data, max(size, start + len(data))


def filesystem_full(job_dir: Path) -> bool:
    """Whether the filesystem holding the spool has no room left for a provider's output
    (the space an unprivileged writer may use). A directory that cannot be checked is not
    reported full: the run's own limits still apply."""
    try:
        info = os.statvfs(job_dir)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < FULL_BELOW_BYTES
