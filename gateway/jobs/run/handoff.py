"""A forked supervisor's run, from its zygote's hand to its gateway's: take the run, supervise
it (supervisor.py), then make sure its end reaches a terminal row (docs/architecture.md,
Running a provider): when the gateway that launched the run is gone, or may go before it
finalizes it, the gateway's own finalizer (gateway/jobs/finalizer.py) writes it.

Stdlib only, and imported as a top-level module by the zygote, like the supervisor.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

try:
    from gateway.jobs.run import supervisor
except ImportError:  # no gateway package: the zygote's isolated interpreter
    import supervisor  # type: ignore[import-not-found,no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# After the end record: how long a supervisor watches for its gateway to finalize the run
# (it removes the spool) before, the gateway being gone, it starts the gateway's finalizer.
# A gateway that lives past it (stopped, slow) finalizes the run itself when it resumes.
FINALIZER_PATIENCE_S = 10.0
FINALIZER_POLL_S = 0.05
# A start time is a kernel tick plus the boot time, which moves by a second when the clock is
# stepped; a pid is reused only after the pid space wraps, far later (gateway/proc.py).
START_TIME_TOLERANCE_S = 1.0


def take_run(run: dict[str, Any], platform: Any, zygote_pid: int | None = None,
             started_at: float | None = None) -> int:
    """Supervise the run a zygote forked this process for (gateway/jobs/run/zygote.py):
    `{"spool_dir", "token", "env", "finalizer"}`, as its gateway sent it through the
    zygote's pipe (the environment and the finalizer's settings may hold secrets: never a
    file). `platform`: the zygote's platform implementation; `zygote_pid`: that zygote,
    which starts the finalizer if the gateway goes after the run's end
    (start_finalizer_if_alone); `started_at`: this process's start time, read ahead. From
    here its stderr goes to the run's log."""
    spool_dir = str(run["spool_dir"])
    try:
        log_fd = os.open(os.path.join(spool_dir, supervisor.LOG_NAME),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except FileNotFoundError:
        pass  # its spool is gone (re-queued elsewhere): supervise() finds no spec and leaves
    else:
        os.dup2(log_fd, 2)
        os.close(log_fd)
    code = supervisor.supervise(spool_dir, str(run["token"]), dict(run["env"]), started_at)
    if code == 0:  # the run ended and is recorded (not claimed elsewhere)
        start_finalizer_if_alone(spool_dir, run.get("finalizer"), platform, zygote_pid)
    return code


def start_finalizer_if_alone(spool_dir: str, finalizer: dict[str, Any] | None,
                             platform: Any, zygote_pid: int | None = None) -> bool:
    """After the run's end record: make sure that the terminal row gets written if the
    gateway that launched the run is gone, or goes before it finalizes the run (nobody else
    will until some gateway starts on this host). Returns whether it started the gateway's
    own finalizer (gateway/jobs/finalizer.py: a session of its own, its settings on stdin).

    - the gateway is gone already: start the finalizer now;
    - this supervisor's zygote (`zygote_pid`, its parent) still lives: leave at once. The
      zygote reads EOF when its gateway goes and then starts the finalizer for each run it
      forked whose end record is still there (zygote.py), so no process lingers per run;
    - the zygote is gone too: watch for FINALIZER_PATIENCE_S in a forked child in a session
      of its own (platform.fork_detached), and leave at once: a gateway that watches the
      run waits for the run's whole group to be gone before it finalizes. A gateway still
      alive after that finalizes the run itself.

    The gateway removes the spool once the row is terminal: a spool without the end record
    is finalized."""
    if not finalizer:
        return False
    if gateway_gone(finalizer, platform):
        return start_finalizer(spool_dir, finalizer, platform)
    if zygote_pid is not None and os.getppid() == zygote_pid:
        return False
    try:
        detached = platform.fork_detached()
    except OSError:
        return False
    if not detached:
        return False  # the supervisor: its run is recorded, it exits now
    try:
        _watch_for_finalizer(spool_dir, finalizer, platform)
    finally:
        os._exit(0)


def gateway_gone(finalizer: dict[str, Any], platform: Any) -> bool:
    """Whether the gateway that `finalizer` names (its pid and start time) has exited."""
    pid, started = finalizer.get("gateway_pid"), finalizer.get("gateway_started_at")
    # (start time, zombie) of the gateway's pid; None: no such process
    state = platform.process_state(pid) if isinstance(pid, int) else None
    return (state is None or started is None or state[1]
            or abs(state[0] - float(started)) > START_TIME_TOLERANCE_S)


def _watch_for_finalizer(spool_dir: str, finalizer: dict[str, Any], platform: Any) -> bool:
    deadline = time.monotonic() + FINALIZER_PATIENCE_S
    while not gateway_gone(finalizer, platform):
        if not os.path.exists(os.path.join(spool_dir, supervisor.END_NAME)):
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(FINALIZER_POLL_S)
    return start_finalizer(spool_dir, finalizer, platform)


def start_finalizer(spool_dir: str, finalizer: dict[str, Any], platform: Any) -> bool:
    """Start the gateway's finalizer for the run of `spool_dir`, unless it is finalized
    already (no end record: the gateway removed the spool). Its stderr goes to the run's
    log; it is in no group of the run's."""
    # Imported here, on this rare path (its gateway is gone), not by the zygote: subprocess
    # imports threading, whose fork hook every forked supervisor would pay (supervisor.py).
    import subprocess  # deferred: start-up (subprocess imports threading: see supervisor.py)

    if not os.path.exists(os.path.join(spool_dir, supervisor.END_NAME)):
        return False
    try:
        log_fd = os.open(os.path.join(spool_dir, supervisor.LOG_NAME),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        log_fd = subprocess.DEVNULL
    try:
        popen = subprocess.Popen(
            [*finalizer["argv"], spool_dir], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=log_fd, cwd="/", env=dict(finalizer["env"]),
            **platform.detach_kwargs())  # not in the run's group: the group's end is the run's
    except OSError as exc:
        sys.stderr.write(f"supervisor: cannot start the finalizer: {exc}\n")
        return False
    finally:
        if log_fd != subprocess.DEVNULL:
            os.close(log_fd)
    assert popen.stdin is not None
    with contextlib.suppress(OSError):
        popen.stdin.write(str(finalizer["settings"]).encode("utf-8"))
    with contextlib.suppress(OSError):
        popen.stdin.close()
    return True
