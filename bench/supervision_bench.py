"""Supervised runs (issue 13): what a run's supervisor costs, and how fast runs outlive
their gateway.

- the supervisor's RSS per run, with the fake CLI's own RSS (a Python interpreter too) as
  the scale;
- SIGKILL of a job's owner -> the job adopted by a running peer on the same host, in sweep
  intervals (adoption runs in every sweep: about one interval is the design);
- a gateway's process start -> the finalization of a run that ended while no gateway was
  alive (adoption runs once at start), next to the same gateway's start -> ready;
- a real stdio gateway (`python -m gateway`, on_shutdown = "detach") with a running job,
  ended as Claude Code ends a session (SIGINT, SIGTERM 100 ms later, SIGKILL 500 ms after
  that): the first signal -> its instance row marked stopped (the detach's last write, after
  the leases were extended), against the target of "about 300 ms", and whether it was done before
  the SIGKILL.

Gateways run in processes of their own (tests/jobs/owner_gateway.py: start, optionally
submit, wait to be killed) on one SQLite store, so SIGKILL is real. Runnable alone:
`uv run python bench/supervision_bench.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.config import Settings, load_settings  # noqa: E402
from gateway.jobs.run import supervisor as sup  # noqa: E402
from gateway.store import open_store  # noqa: E402
from gateway.store.base import JobStore  # noqa: E402
from tests.children import reap  # noqa: E402

FAKE_CLAUDE = ROOT / "tests" / "fakes" / "bin" / "claude"
# Lease knobs of these rows: the sweep is the unit of the adoption row, so it is short
# (the default 30 s would make each sample last a minute); ttl >= 2 heartbeats.
LEASE = {"heartbeat_s": 0.5, "ttl_s": 2.0, "http_job_grace_s": 2.0, "sweep_interval_s": 1.0,
         "instance_gc_s": 2.0, "cancel_poll_s": 0.5}
POLL_S = 0.01  # how often the bench reads the row: well under a sweep
RUN_S = 3.0  # the adopted job's @sleep: still running when its owner dies
SHORT_RUN_S = 0.3  # the job that ends while no gateway is alive
STEP_TIMEOUT_S = 30.0  # any one step (a start, an adoption) on a loaded box
SETTLE_S = 0.3  # a started supervisor and CLI past their imports before their RSS is read


def write_settings(workdir: Path) -> tuple[Settings, Path]:
    """One SQLite store (the spool beside it) shared by every gateway of these rows."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "supervision.toml"
    config.write_text(tomli_w.dumps({
        "persistence": {"backend": "sqlite", "path": str(workdir / "state" / "jobs.db")},
        "lease": LEASE,
        "providers": {"claude": {"command": str(FAKE_CLAUDE)}},
    }))
    settings = load_settings(path=config)
    pickled = workdir / "supervision-settings.pickle"
    pickled.write_bytes(pickle.dumps(settings))
    return settings, pickled


class Owner:
    """A gateway process (owner_gateway): it submits `prompt` (or none: "-") and waits."""

    def __init__(self, pickled: Path, prompt: str) -> None:
        self.started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.owner_gateway", str(pickled), "claude", prompt],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        self.job_id: str | None = None
        self.ready_s: float | None = None

    async def ready(self) -> None:
        """Until it printed JOB <id> or READY (the gateway started)."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self._first_line), STEP_TIMEOUT_S)
        self.ready_s = time.monotonic() - self.started
        if line.startswith("JOB "):
            self.job_id = line.split()[1]

    def _first_line(self) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(("JOB ", "READY")):
                return line
        raise RuntimeError("owner gateway exited before it was ready")

    def kill(self) -> None:
        """SIGKILL it (if it still runs) and collect it, its stdout closed. Idempotent."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        reap(self.process, grace_s=STEP_TIMEOUT_S)


async def until(store: JobStore, job_id: str, check: Any) -> Any:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        row = await store.get_job(job_id)
        if row is not None and check(row):
            return row
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"job {job_id}: condition not met in {STEP_TIMEOUT_S} s")


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


async def adoption_samples(settings: Settings, pickled: Path, store: JobStore,
                           samples: int) -> dict[str, Any]:
    peer = Owner(pickled, "-")
    await peer.ready()
    adopt_s: list[float] = []
    sup_rss: list[float] = []
    cli_rss: list[float] = []
    try:
        for i in range(samples):
            owner = Owner(pickled, f"adopt {i} {time.time_ns()} @sleep={RUN_S}")
            try:
                await owner.ready()
                assert owner.job_id is not None
                row = await until(store, owner.job_id, lambda r: r.pid is not None)
                supervisor = psutil.Process(row.pid)
                deadline = time.monotonic() + STEP_TIMEOUT_S
                while not (children := supervisor.children()) and time.monotonic() < deadline:
                    await asyncio.sleep(POLL_S)  # the supervisor names itself, then the CLI
                await asyncio.sleep(SETTLE_S)  # both interpreters past their imports
                sup_rss.append(rss_mb(supervisor.pid))
                if children:
                    cli_rss.append(rss_mb(children[0].pid))
                first_owner = row.owner_instance
                killed = time.monotonic()
                owner.kill()
            finally:
                owner.kill()  # idempotent: here for a step above that failed
            await until(store, owner.job_id, lambda r, o=first_owner: r.owner_instance != o)
            adopt_s.append(time.monotonic() - killed)
            done = await until(store, owner.job_id, lambda r: r.status.is_terminal)
            if str(done.status) != "completed":
                raise RuntimeError(f"adopted job ended {done.status}: {done.error}")
    finally:
        peer.kill()
    sweep = settings.lease.sweep_interval_s
    return {"samples": samples, "sweep_interval_s": sweep, "adopt_s": adopt_s,
            "adopt_median_s": statistics.median(adopt_s),
            "adopt_median_sweeps": statistics.median(adopt_s) / sweep,
            "adopt_max_sweeps": max(adopt_s) / sweep,
            "supervisor_rss_mb": sup_rss, "supervisor_rss_median_mb": statistics.median(sup_rss),
            "cli_rss_median_mb": statistics.median(cli_rss) if cli_rss else None}


async def finalize_samples(pickled: Path, store: JobStore, spool_root: Path,
                           samples: int) -> dict[str, Any]:
    finalize_s: list[float] = []
    ready_s: list[float] = []
    for i in range(samples):
        owner = Owner(pickled, f"ended alone {i} {time.time_ns()} @sleep={SHORT_RUN_S}")
        try:
            await owner.ready()
            assert owner.job_id is not None
            await until(store, owner.job_id, lambda r: r.pid is not None)
        finally:
            owner.kill()
        end = spool_root / owner.job_id / "0" / sup.END_NAME
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not end.exists():  # the run ends while no gateway is alive
            if time.monotonic() > deadline:
                raise RuntimeError(f"no end record for {owner.job_id}")
            await asyncio.sleep(POLL_S)
        row = await store.get_job(owner.job_id)
        assert row is not None and not row.status.is_terminal
        nxt = Owner(pickled, "-")
        try:
            done = await until(store, owner.job_id, lambda r: r.status.is_terminal)
            finalize_s.append(time.monotonic() - nxt.started)
            await nxt.ready()
            assert nxt.ready_s is not None
            ready_s.append(nxt.ready_s)
            if str(done.status) != "completed":
                raise RuntimeError(f"job ended {done.status}: {done.error}")
        finally:
            nxt.kill()
    return {"samples": samples, "finalize_s": finalize_s, "ready_s": ready_s,
            "finalize_median_s": statistics.median(finalize_s),
            "ready_median_s": statistics.median(ready_s)}


CLAUDE_CODE_SIGTERM_AFTER_S = 0.1  # Claude Code 2.1.332 at the end of a session (issue 13)
CLAUDE_CODE_SIGKILL_AFTER_S = 0.6  # SIGKILL 500 ms after the SIGTERM
DETACH_TARGET_S = 0.3  # the lease design: a detach within about 300 ms of the first signal


class StdioGateway:
    """`python -m gateway` on pipes, spoken to in raw JSON-RPC (one request at a time)."""

    def __init__(self, config: Path, home: Path) -> None:
        env = {"HOME": str(home), "PATH": os.environ.get("PATH", os.defpath),
               "AGENT_GATEWAY_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway"], cwd=home, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._id = 0

    def close(self) -> None:
        """Collect it, its pipes closed (EOF on its stdin ends a gateway still serving)."""
        reap(self.process, grace_s=STEP_TIMEOUT_S)

    def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self._id += 1
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self._id,
                                             "method": method, "params": params}).encode()
                                 + b"\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            message = json.loads(line)
            if message.get("id") == self._id:
                if "result" not in message:
                    raise RuntimeError(f"{method}: {message}")
                return dict(message["result"])
        raise RuntimeError("the stdio gateway exited")

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result = self._request("tools/call", {"name": tool, "arguments": args})
        if result.get("isError"):
            raise RuntimeError(f"{tool}: {result}")
        return dict(result["structuredContent"])

    def open_with_running_job(self) -> str:
        assert self.process.stdin is not None
        self._request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "detach-bench", "version": "0"}})
        self.process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.process.stdin.flush()
        self._request("tools/list", {})
        job_id = str(self.call("claude_request_async", {"prompt": "detach @sleep=5"})["job_id"])
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while self.call("llm_job_status", {"job_id": job_id})["status"] != "running":
            if time.monotonic() > deadline:
                raise RuntimeError("the job never started")
            time.sleep(POLL_S)
        return job_id

    def end_like_claude_code(self) -> tuple[float, float | None]:
        """The signals, on Claude Code's timeline; (first signal's time, exit after it, or
        None if the SIGKILL ended it)."""
        t0 = time.time()
        self.process.send_signal(signal.SIGINT)
        for after, sig in ((CLAUDE_CODE_SIGTERM_AFTER_S, signal.SIGTERM),
                           (CLAUDE_CODE_SIGKILL_AFTER_S, signal.SIGKILL)):
            try:
                self.process.wait(max(0.0, t0 + after - time.time()))
                return t0, time.time() - t0
            except subprocess.TimeoutExpired:
                self.process.send_signal(sig)
        self.process.wait(10)
        return t0, None


async def detach_samples(workdir: Path, samples: int) -> dict[str, Any]:
    """Each sample a fresh store: its one instance row is the gateway's."""
    detach_s: list[float] = []
    exit_s: list[float] = []  # first signal -> the process exited by itself
    killed = 0
    for n in range(samples):
        sample_dir = workdir / f"detach-{n}"
        settings, _ = write_settings(sample_dir)
        config = sample_dir / "supervision.toml"
        (sample_dir / "home").mkdir(exist_ok=True)
        gateway = StdioGateway(config, sample_dir / "home")
        try:
            job_id = await asyncio.to_thread(gateway.open_with_running_job)
            t0, exited_after = await asyncio.to_thread(gateway.end_like_claude_code)
        finally:
            gateway.close()
        killed += exited_after is None
        if exited_after is not None:
            exit_s.append(exited_after)
        store = await open_store(settings)
        try:
            (instance,) = await store.list_instances()
            row = await store.get_job(job_id, with_output=False)
            assert row is not None and row.status.is_active, row
            if instance.stopped_at is None:
                raise RuntimeError(f"sample {n}: SIGKILLed before the detach was written")
            detach_s.append(instance.stopped_at.timestamp() - t0)
        finally:
            await store.close()
        # The detached run goes on (its supervisor may still be starting): not this bench's
        # business once it is claimed, so it is stopped here.
        spool_dir = settings.state_dir / "spool" / job_id / "0"
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while (claim := sup.read_record(spool_dir, sup.START_NAME)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sample {n}: the detached run was never claimed")
            await asyncio.sleep(POLL_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(claim["pgid"]), signal.SIGKILL)
    return {"samples": samples, "detach_s": detach_s, "sigkilled": killed, "exit_s": exit_s,
            "detach_median_s": statistics.median(detach_s), "detach_max_s": max(detach_s),
            "target_s": DETACH_TARGET_S}


async def run_supervision_benches(workdir: Path, samples: int) -> dict[str, Any]:
    settings, pickled = write_settings(workdir)
    store = await open_store(settings)
    try:
        adoption = await adoption_samples(settings, pickled, store, samples)
        finalize = await finalize_samples(pickled, store, settings.state_dir / "spool", samples)
    finally:
        await store.close()
    detach = await detach_samples(workdir, samples)
    return {"adoption": adoption, "finalize": finalize, "detach": detach}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="acg-supervision-") as tmp:
        print(json.dumps(asyncio.run(run_supervision_benches(Path(tmp), 5)), indent=2))
