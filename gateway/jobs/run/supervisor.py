"""The supervisor of one run: a small program that outlives its gateway (docs/architecture.md).

The gateway's zygote (gateway/jobs/run/zygote.py: its own interpreter in isolated mode, this
module imported) forks it for each run, and the fork leaves the zygote's session at once
(gateway/platform `fork_session`), so the supervisor leads the run's process group; it gets
its run (spool dir, token, the CLI's environment) through the zygote's pipe (`take_run`). By
hand it runs one run as `python -I -S .../gateway/jobs/run/supervisor.py <spool_dir> <token>`.
It reads the run's spec (`run.json`, written by the gateway), claims the run, starts the CLI
in its own group with stdout/stderr on the spool files, and enforces by itself what must
hold while no gateway is alive: the wall-clock `timeout_s`, the idle timeout of streaming
CLIs and the output cap, each a stop of the whole group (SIGTERM, then SIGKILL after
`kill_grace_s`). It records the run's end atomically (`end.json`) and exits.

Stdlib only, and importable: the gateway reads the records through the functions below, so
the record format has one home. What differs by OS (its own start time, who is in its group,
the CLI's exit wait, autogroups, staying non-dumpable) comes from the platform implementation
its gateway uses (spec `platform`), imported from gateway/platform as a top-level module.

Files in the spool dir (all 0600):
- `run.json`   the spec, written by the gateway before it starts the supervisor
- `stdin`      the prompt when the CLI takes it on stdin (removed once read)
- `start.json` the claim: first writer wins (a hard link cannot replace a file). The
               supervisor writes its pid and start time there BEFORE it starts the CLI; a
               gateway that re-queues a job that never started writes `requeued` there
               instead, and a supervisor that comes too late then never runs it. So a run is
               launched at most once whatever crashes in between: the spool record decides.
- `stop.json`  a stop request from a gateway (why, grace), followed by SIGTERM to the supervisor
- `end.json`   the end record, versioned: exit code or signal, start/end time, why it ended

Why the stops signal members one by one instead of killpg(): the supervisor is a member of
its own group and must outlive the SIGKILL to write the end record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import sys
import time

# Imported for the type checker only: pathlib and typing cost the zygote's start about 10 ms
# (and the first run of a gateway waits for the zygote). Not imported at all: subprocess and
# threading. threading hooks fork() (os.register_at_fork): with it imported, every fork of
# the zygote ran Python code in the child and copied about 125 more pages, 0.45 ms of CPU
# per run on a 2-core box (the CLI is started with os.posix_spawn; a prompt larger than its
# pipe imports threading in that one run, for its feeder).
# The functions below take a str or any os.PathLike (the gateway passes Path).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    StrPath = str | os.PathLike[str]

# The spool records' format, in every record's "version" (run.json, start.json, stop.json,
# end.json). The reader rule (docs/architecture.md, spool records): a gateway reads its own
# version and every older one (release N reads N-1's: docs/operations.md, upgrades), and
# refuses a newer one (record_version_problem) rather than misread fields it does not know;
# bump only with a reader. 2 (0.2.0): the start claim carries the launch token of run.json
# (gateway/jobs/run/trust.py); 1 (0.1.0): it did not.
RECORD_VERSION = 2
OLDEST_RECORD_VERSION = 1
RUN_NAME = "run.json"
STDIN_NAME = "stdin"
START_NAME = "start.json"
STOP_NAME = "stop.json"
END_NAME = "end.json"
STDOUT_NAME = "stdout"
STDERR_NAME = "stderr"
LOG_NAME = "supervisor.log"  # the supervisor's own stderr (a traceback, if any)

# Why a run ended (end.json "why"). "stop" carries the gateway's reason in "stop_kind".
WHY_EXIT = "exit"  # the CLI exited by itself (its code or signal is in the record)
WHY_TIMEOUT = "timeout"
WHY_IDLE = "idle_timeout"
WHY_OUTPUT = "output_limit"
WHY_STOP = "stop"  # a gateway asked (cancel, shutdown)
WHY_SIGNAL = "signal"  # SIGTERM with no stop request: someone outside the gateway
WHY_LAUNCH = "launch_failed"
WHY_NOT_FOUND = "not_found"

CLAIMED_ELSEWHERE_EXIT = 3  # the supervisor's exit code when the claim was already taken

# How often the leader's exit, the spool sizes and the clock are checked. Bounds how late a
# limit is noticed; a stat() pair and a waitpid() per tick cost nothing.
MONITOR_INTERVAL_S = 0.05
# After SIGKILL: how long to wait for members to vanish before recording the run anyway.
# SIGKILL cannot be ignored; only uninterruptible sleep (a hung NFS read) delays it.
REAP_TIMEOUT_S = 5.0
STDIN_CHUNK_BYTES = 64 * 1024


# -- records: written atomically, read by the gateway --------------------------------------


def _write_tmp(directory: StrPath, name: str, record: dict[str, Any]) -> str:
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, json.dumps(record, sort_keys=True).encode("utf-8"))
    finally:
        os.close(fd)
    return tmp


# No record is fsynced. Only the boot that wrote a spool acts on it: a running job of a
# previous boot is never adopted nor re-queued, whatever its spool says (its row is
# orphaned: adoption.settle), so after a power loss these files would tell nobody anything.
# Within a boot every process sees them at once (the page cache); the claim's fsyncs were
# the largest single cost on a sync request's path (1.2 ms, issue #26), and on macOS an
# fsync does not even reach the disk.


def write_record(directory: StrPath, name: str, record: dict[str, Any]) -> None:
    """Replace `name` atomically: a reader sees the old record or the whole new one."""
    tmp = _write_tmp(directory, name, record)
    os.replace(tmp, os.path.join(directory, name))


def claim_record(directory: StrPath, name: str, record: dict[str, Any]) -> bool:
    """Create `name` only if no one has: True for the one writer that wins."""
    tmp = _write_tmp(directory, name, record)
    try:
        os.link(tmp, os.path.join(directory, name))  # fails if it exists: first writer wins
    except FileExistsError:
        return False
    finally:
        _unlink_quietly(tmp)
    return True


def _unlink_quietly(path: StrPath) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _read_bytes(path: StrPath) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def read_record(directory: StrPath, name: str) -> dict[str, Any] | None:
    """A record, or None when absent or unreadable (a torn write cannot happen: rename)."""
    try:
        data = json.loads(_read_bytes(os.path.join(directory, name)))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def record_version_problem(name: str, record: dict[str, Any] | None) -> str | None:
    """Why this release must not act on `record` (the spool record `name`), or None: absent,
    or of a format this release reads (RECORD_VERSION or older). A newer format is refused,
    never read as if it were ours: a gateway of that release (or later) settles the run."""
    if record is None:
        return None
    version = record.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < OLDEST_RECORD_VERSION:
        return f"{name} carries no format version this gateway knows ({version!r})"
    if version > RECORD_VERSION:
        return (f"{name} is of spool format {version}, newer than this gateway reads "
                f"({RECORD_VERSION}): a gateway of the release that wrote it settles the run; "
                f"upgrade agent-cli-gateway")
    return None


def claim_for_requeue(spool_dir: StrPath, by: str) -> bool:
    """A gateway about to re-queue a job that shows no start: claim the run so that a late
    supervisor never starts it. False: a supervisor started it (or is starting it)."""
    os.makedirs(spool_dir, mode=0o700, exist_ok=True)
    return claim_record(spool_dir, START_NAME, {"version": RECORD_VERSION, "kind": "requeued",
                                                "by": by, "at": time.time()})


# -- process helpers (stdlib: the supervisor imports nothing of the gateway) ---------------


def load_platform(spec: dict[str, Any]) -> Any:
    """The platform implementation the gateway chose (`platform`: "linux" or "portable"),
    imported from the folders it named (`platform_path`: gateway/platform, and for portable
    psutil's). Appended after the stdlib: nothing there can shadow a stdlib module. The zygote
    has imported it already (zygote.py), so this costs nothing on the run's path."""
    for path in spec.get("platform_path") or [_PLATFORM_DIR]:
        if path not in sys.path:
            sys.path.append(path)
    return __import__(str(spec.get("platform") or "portable"))


_PLATFORM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "platform")


def _signal_members(platform: Any, pgid: int, sig: int) -> None:
    for pid in platform.group_members(pgid, os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _fill_pipe(fd: int, payload: bytes) -> bytes:
    """Write what of `payload` the empty pipe `fd` takes without blocking; the rest.

    A prompt is mostly a few kilobytes and a pipe holds 16-64 KiB: written before the CLI
    starts, it needs no feeder thread, whose start cost up to a millisecond and a half on the
    path of every run (the new thread waits for the CPU beside the CLI starting up)."""
    os.set_blocking(fd, False)
    try:
        written = os.write(fd, payload)
    except BlockingIOError:
        written = 0
    finally:
        os.set_blocking(fd, True)
    return payload[written:]


def _size(path: StrPath) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class Cli:
    """The CLI's process: started by os.posix_spawn in this supervisor's group (no new
    session: one pgid holds the run), reaped by waitpid.

    Not subprocess.Popen: that module imports threading (see the imports), and its child
    setup is Python code run in every supervisor; posix_spawn is one call (vfork and exec
    on Linux, the native call on macOS) that reports a failed exec as an OSError. What
    Popen did and this keeps: stdin, stdout and stderr on the given descriptors, every other
    descriptor closed (each one this process opens is close-on-exec, PEP 446; the zygote
    closed its own before the run), SIGPIPE and SIGXFSZ back to their defaults, the given
    working directory and environment, the command searched on that environment's PATH."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def spawn(cls, argv: list[str], cwd: str, env: dict[str, str] | None,
              stdio: tuple[int, int, int]) -> Cli:
        environ = dict(os.environ) if env is None else env
        command = argv[0]
        if os.sep not in command:
            found = shutil.which(command, path=environ.get("PATH", os.defpath))
            if found is None:
                raise FileNotFoundError(2, "No such file or directory", command)
            command = found
        # os.posix_spawn takes no working directory: the supervisor (single-threaded) steps
        # into it for the spawn and out again, holding no directory of the run's.
        # The dup2 actions run in order: a descriptor below 3 could be overwritten before it
        # is copied, so those are copied above 2 first.
        lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in stdio if fd < 3]
        sources = iter(lifted)
        actions = [(os.POSIX_SPAWN_DUP2, fd if fd > 2 else next(sources), target)
                   for target, fd in enumerate(stdio)]
        os.chdir(cwd)
        try:
            pid = os.posix_spawn(command, argv, environ, file_actions=actions,
                                 setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        finally:
            os.chdir("/")
            for fd in lifted:
                os.close(fd)
        return cls(pid)

    def poll(self) -> int | None:
        """The returncode (-N: killed by signal N) once it exited, reaping it; else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped already, or SIGCHLD ignored: its status is lost
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


# -- the supervisor ------------------------------------------------------------------------


class Supervisor:
    def __init__(self, spool_dir: str, spec: dict[str, Any],
                 env: dict[str, str] | None = None, started_at: float | None = None) -> None:
        self.dir = spool_dir
        self.spec = spec
        self.env = env  # the CLI's environment (None: this process's own)
        self.platform = load_platform(spec)
        self.pgid = os.getpgrp()
        self.started_at = started_at or self.platform.own_start_time() or time.time()
        self.start_mono = time.monotonic()
        self.stop_signalled = False
        self.stdin_incomplete = False
        self._autogroup_pending = False
        self.out = os.path.join(spool_dir, STDOUT_NAME)
        self.err = os.path.join(spool_dir, STDERR_NAME)

    def end(self, why: str, **fields: Any) -> None:
        record: dict[str, Any] = {
            "version": RECORD_VERSION, "pid": os.getpid(), "pgid": self.pgid,
            "started_at": self.started_at, "ended_at": time.time(),
            "duration_s": time.monotonic() - self.start_mono, "why": why,
            "returncode": None, "stdout_bytes": _size(self.out), "stderr_bytes": _size(self.err),
            "truncated": False, "stdin_incomplete": self.stdin_incomplete,
        }
        record.update(fields)
        write_record(self.dir, END_NAME, record)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_signalled = True

    def _lower_priority(self) -> None:
        """The nice value the gateway chose (absolute, so a repeat changes nothing), inherited
        by the CLI: the gateway's own heartbeat and answers go first (runner.py)."""
        target = self.spec.get("nice")
        if target is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, int(target))
        self._autogroup_pending = self.spec.get("autogroup_nice") is not None
        if not self._autogroup_pending:
            self.platform.make_non_dumpable()
        else:  # forked from a non-dumpable zygote: its autogroup file is root's until this
            self.platform.make_dumpable()
        self._retry_autogroup()

    def _retry_autogroup(self) -> None:
        # The kernel lets an unprivileged process change an autogroup's nice value at most
        # once per 100 ms (EAGAIN), which a burst of runs hits: retried each tick.
        # Then non-dumpable: its own autogroup file is not writable once it is.
        if not self._autogroup_pending:
            return
        if not self.platform.set_autogroup_nice(0, int(self.spec["autogroup_nice"])):
            return
        self._autogroup_pending = False
        self.platform.make_non_dumpable()

    def run(self) -> int:
        spec = self.spec
        signal.signal(signal.SIGTERM, self._on_sigterm)
        for ignored in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(ignored, signal.SIG_IGN)
        self._lower_priority()  # before the claim: a gateway that sees the claim sees it done
        claim = {"version": RECORD_VERSION, "kind": "supervisor", "pid": os.getpid(),
                 "pgid": self.pgid, "started_at": self.started_at, "at": time.time(),
                 "token": spec.get("token")}  # an adopter matches it with run.json's
        if not claim_record(self.dir, START_NAME, claim):
            return CLAIMED_ELSEWHERE_EXIT  # re-queued (or another supervisor): never run twice
        payload: bytes | None = None
        stdin_path = os.path.join(self.dir, STDIN_NAME)
        if spec.get("stdin"):
            try:
                payload = _read_bytes(stdin_path)
            finally:
                _unlink_quietly(stdin_path)
        try:
            child, writer = self._spawn(payload)
        except FileNotFoundError:
            self._remove_temp_cwd()
            self.end(WHY_NOT_FOUND, error=f"The '{spec['argv'][0]}' command was not found.")
            return 0
        except OSError as exc:
            self._remove_temp_cwd()
            self.end(WHY_LAUNCH, error=f"Failed to launch '{spec['argv'][0]}': "
                                       f"{exc.strerror or exc}.")
            return 0
        why, returncode, stop, strays = self._watch(child)
        if writer is not None:
            writer.join(timeout=0.5)
        written = _size(self.out) + _size(self.err)
        truncated = self._truncate_to_cap()
        self._remove_temp_cwd()
        self.end(why, returncode=returncode, truncated=truncated, bytes_written=written,
                 strays=strays, stop_kind=(stop or {}).get("kind"),
                 stop_message=(stop or {}).get("message"))
        return 0

    def _spawn(self, payload: bytes | None) -> tuple[Cli, Any]:
        """Start the CLI in this supervisor's group; (the CLI, the feeder thread of a prompt
        larger than its pipe, or None). Raises OSError as the CLI's start failed (a missing
        command or working directory: FileNotFoundError)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        out_fd = os.open(self.out, flags, 0o600)
        err_fd = os.open(self.err, flags, 0o600)
        stdin_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        write_fd: int | None = None
        rest = b""
        try:
            if payload is not None:
                # os.pipe: close-on-exec already (PEP 446); macOS has no pipe2.
                os.close(stdin_fd)
                stdin_fd, write_fd = os.pipe()
                rest = _fill_pipe(write_fd, payload)
                if not rest:  # the whole prompt waits in the pipe: EOF follows it
                    os.close(write_fd)
                    write_fd = None
            child = Cli.spawn(self.spec["argv"], self.spec["cwd"], self.env,
                              (stdin_fd, out_fd, err_fd))
        except BaseException:
            if write_fd is not None:
                os.close(write_fd)
            raise
        finally:
            for fd in (out_fd, err_fd, stdin_fd):
                os.close(fd)
        writer = None
        if write_fd is not None:  # a prompt larger than the pipe: fed as the CLI reads it
            import threading  # deferred: start-up (threading hooks every fork: see the imports above)

            writer = threading.Thread(target=self._feed, args=(write_fd, rest), daemon=True)
            writer.start()
        return child, writer

    def _feed(self, fd: int, payload: bytes) -> None:
        """Write the prompt into the CLI's stdin, then close it (`codex exec` waits for EOF)."""
        view = memoryview(payload)
        try:
            while view:
                view = view[os.write(fd, view[:STDIN_CHUNK_BYTES]):]
        except OSError:  # EPIPE: the CLI closed stdin (or exited) before reading it all
            self.stdin_incomplete = True
        finally:
            os.close(fd)

    def _breach(self, last_growth: float) -> str | None:
        spec, now = self.spec, time.monotonic()
        if _size(self.out) + _size(self.err) > spec["max_output_bytes"]:
            return WHY_OUTPUT
        if now - self.start_mono >= spec["timeout_s"]:
            return WHY_TIMEOUT
        idle = spec.get("idle_timeout_s")
        if idle is not None and now - last_growth >= idle:
            return WHY_IDLE
        return None

    def _stop_request(self) -> dict[str, Any]:
        request = read_record(self.dir, STOP_NAME)
        if request is None or record_version_problem(STOP_NAME, request) is not None:
            # A stop request of a newer format is still a stop (its SIGTERM came), but its
            # reason and grace are not read as ours: the end record says why=signal.
            return {"kind": None}
        return request

    def _watch(self, child: Cli
               ) -> tuple[str, int | None, dict[str, Any] | None, int]:
        """Until the CLI exited and the group is empty: (why, returncode, stop, strays)."""
        exit_watch = self.platform.exit_watch(child.pid)  # None: the tick alone notices
        try:
            return self._watch_until_gone(child, exit_watch)
        finally:
            if exit_watch is not None:
                exit_watch.close()

    def _watch_until_gone(self, child: Cli, exit_watch: Any
                          ) -> tuple[str, int | None, dict[str, Any] | None, int]:
        why: str | None = None
        stop: dict[str, Any] | None = None
        kill_at: float | None = None
        sizes = (-1, -1)
        last_growth = time.monotonic()
        strays = 0
        while True:
            returncode = child.poll()
            now = time.monotonic()
            current = (_size(self.out), _size(self.err))
            if current != sizes:
                sizes, last_growth = current, now
            if self.stop_signalled:  # a (new) stop request: it may shorten the grace
                self.stop_signalled = False
                stop = self._stop_request()
                if why is None and returncode is None:  # after its own exit: the CLI's outcome
                    why = WHY_STOP if stop.get("kind") else WHY_SIGNAL
                grace = float(stop.get("grace_s", self.spec["kill_grace_s"]))
                kill_at = min(kill_at or now + grace, now + grace)
                _signal_members(self.platform, self.pgid, signal.SIGTERM)
            elif why is None and returncode is None:
                why = self._breach(last_growth)
                if why is not None:
                    kill_at = now + self.spec["kill_grace_s"]
                    _signal_members(self.platform, self.pgid, signal.SIGTERM)
            if returncode is not None:
                members = self.platform.group_members(self.pgid, os.getpid())
                if not members:
                    return why or WHY_EXIT, returncode, stop, strays
                if kill_at is None:  # the CLI is done but left processes: stop them too
                    strays = len(members)
                    kill_at = now + self.spec["kill_grace_s"]
                    _signal_members(self.platform, self.pgid, signal.SIGTERM)
            self._retry_autogroup()
            if kill_at is not None and now >= kill_at:
                self._kill_all(child)
                return why or WHY_EXIT, child.wait(), stop, strays
            if returncode is None and exit_watch is not None:
                # Wakes the moment the CLI exits (its exit watch turns readable), or after a
                # tick: the run's end is on the critical path of every sync request.
                select.select([exit_watch], [], [], MONITOR_INTERVAL_S)
            else:
                time.sleep(MONITOR_INTERVAL_S)

    def _kill_all(self, child: Cli) -> None:
        deadline = time.monotonic() + REAP_TIMEOUT_S
        while time.monotonic() < deadline:
            _signal_members(self.platform, self.pgid, signal.SIGKILL)
            child.poll()  # reap the CLI so it stops counting as a member
            if not self.platform.group_members(self.pgid, os.getpid()):
                return
            time.sleep(MONITOR_INTERVAL_S)

    def _truncate_to_cap(self) -> bool:
        """Cut the spool files to max_output_bytes in total, stdout first (it carries the
        answer). Only once the group is gone: no writer can extend them again."""
        cap = int(self.spec["max_output_bytes"])
        out, err = _size(self.out), _size(self.err)
        if out + err <= cap:
            return False
        keep_out = min(out, cap)
        keep_err = min(err, cap - keep_out)
        for path, size, keep in ((self.out, out, keep_out), (self.err, err, keep_err)):
            if size > keep:
                os.truncate(path, keep)
        return True

    def _remove_temp_cwd(self) -> None:
        if self.spec.get("temp_cwd"):  # mostly empty: one rmdir, not rmtree's walk (0.4 ms)
            try:
                os.rmdir(self.spec["cwd"])
            except FileNotFoundError:
                pass
            except OSError:
                shutil.rmtree(self.spec["cwd"], ignore_errors=True)  # what the CLI left there


def supervise(spool_dir: str, token: str, env: dict[str, str] | None,
              started_at: float | None = None) -> int:
    """Claim and supervise the run of `spool_dir` if its spec carries `token`; the exit code
    (0: the run ended and its end record is written). `env`: the CLI's environment (None:
    this process's own); `started_at`: this process's start time if it was read already.
    What follows the end record is handoff.py's."""
    spool_dir = os.path.abspath(spool_dir)  # the CLI is started from inside its cwd
    spec = read_record(spool_dir, RUN_NAME)
    if spec is None or spec.get("token") != token:
        return CLAIMED_ELSEWHERE_EXIT  # not our run (re-queued and relaunched): never run it
    problem = record_version_problem(RUN_NAME, spec)
    if problem is not None:  # a spec this supervisor cannot read: never run it half-read
        sys.stderr.write(f"supervisor: {problem}\n")
        return 2
    return Supervisor(spool_dir, spec, env, started_at).run()


def main(argv: list[str]) -> int:
    """`supervisor.py SPOOL_DIR TOKEN`: one run, this process's environment the CLI's (by
    hand, and in tests; a gateway forks its supervisors from its zygote)."""
    if len(argv) != 3:
        sys.stderr.write("usage: supervisor.py SPOOL_DIR TOKEN\n")
        return 2
    return supervise(argv[1], argv[2], None)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
