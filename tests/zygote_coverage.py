"""Branch coverage of the zygote and of the supervisors it forks, while pytest-cov measures.

The zygote runs under `python -I -S` with an empty environment (gateway/jobs/run/forks.py),
so coverage's own subprocess hook (a .pth file and COVERAGE_PROCESS_START) cannot reach it:
no site import, no environment. Instead, in a measured session, the zygote this test process
starts gets a boot line that starts coverage first (`forks.ZYGOTE_BOOT` is read at each
zygote's start). It writes a parallel data file next to the session's, which pytest-cov
combines at the end. Coverage's `_exit` patch saves the data of every process that leaves
with os._exit: the zygote and each forked supervisor (coverage starts a new data file in a
forked child). A SIGKILLed one records nothing, which only under-counts.

Coverage's folder is on the zygote's sys.path only while coverage is imported: the zygote
must still find nothing but the stdlib (and its own folders) when it imports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import coverage
import psutil

from gateway.jobs.run import forks
from gateway.jobs.run.runner import ZYGOTE

ROOT = Path(__file__).resolve().parent.parent
# A zygote exits at once at EOF (after EXITING_WAIT_S at most, for runs that are ending).
ZYGOTE_EXIT_WAIT_S = 10.0


def measured_boot(rcfile_dir: Path) -> str | None:
    """The zygote's boot line that measures it, or None when this process is not measured."""
    current = coverage.Coverage.current()
    if current is None:
        return None
    config = current.config
    # Absolute source folders: the zygote's cwd is `/` and it has no `gateway` package.
    sources = [str(ROOT / name) for name in (config.source or ["gateway", "providers", "neutral"])]
    rcfile = rcfile_dir / "zygote-coverage.ini"
    rcfile.write_text(
        "[run]\n"
        f"branch = {bool(config.branch)}\n"
        "parallel = True\n"
        f"data_file = {os.path.abspath(config.data_file)}\n"
        "source =\n" + "".join(f"    {source}\n" for source in sources) +
        "patch = _exit\n"
        "disable_warnings = no-data-collected, module-not-imported\n",
        encoding="utf-8")
    coverage_dir = str(Path(coverage.__file__).resolve().parent.parent)
    return (f"import sys; sys.path.append({coverage_dir!r}); import coverage; "
            f"sys.path.remove({coverage_dir!r}); "
            f"coverage.Coverage(config_file={str(rcfile)!r}).start(); " + forks.ZYGOTE_BOOT)


def close_zygote() -> None:
    """Close this process's zygote and wait (bounded) until it has exited."""
    pid = ZYGOTE.pid
    ZYGOTE.close()
    deadline = time.monotonic() + ZYGOTE_EXIT_WAIT_S
    while pid is not None and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
