"""The operator's read commands answer like a small program (issue #45: `jobs list`, `jobs
show`, `usage` under 250 ms on a quiet box): they read the store and load neither the MCP
SDK, nor the HTTP stack, nor the job machinery that runs jobs.

Behaviour, not timing (timing is bench/cli_bench.py's): each command runs as the console
entry in a process of its own against a real SQLite store, then names the modules it
loaded that a read must not need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.model import Completion, InstanceRow, JobStatus, NewJob
from tests.cli.cli_support import CLI_TIMEOUT_S, Cli, hermetic_env

REPO = Path(__file__).resolve().parents[2]
# What serving needs and reading does not: the MCP SDK and its types, the HTTP client and
# server stacks, our MCP front end, and the job machinery (manager, adopter, finalizer).
NOT_FOR_READING = ("mcp", "mcp_types", "starlette", "uvicorn", "httpx", "httpx2", "httpcore",
                   "httpcore2", "gateway.mcp", "gateway.runtime", "gateway.jobs.manager",
                   "gateway.jobs.adoption", "gateway.jobs.finalizer", "gateway.jobs.leases")
OWNER = "instance-read-imports"
DONE = "dddd1111-0000-4000-8000-000000000001"
RUNNING = "dddd2222-0000-4000-8000-000000000002"
# Runs the console entry, then prints what it loaded of NOT_FOR_READING on a line of its own.
PROBE = ("import sys\n"
         "from gateway.entry import main\n"
         "code = main()\n"
         "names = {names!r}\n"
         "inside = tuple(n + '.' for n in names)\n"
         "loaded = sorted(m for m in sys.modules if m in names or m.startswith(inside))\n"
         "print('LOADED', ' '.join(loaded) or '-')\n"
         "sys.exit(code)\n")


def seed(cli: Cli) -> None:
    """A completed job and one running on another host (a live owner: nothing to finalize)."""
    async def run(store: Any) -> None:
        await store.register_instance(InstanceRow(
            instance_id=OWNER, hostname="elsewhere", boot_id="b", pid=1, pid_started_at=None,
            role="stdio", version="t"), ttl_s=3600)
        for job_id in (DONE, RUNNING):
            request: dict[str, Any] = {"provider": "claude", "prompt": "read me", "model": None,
                                       "options": {}}
            await store.insert_job(NewJob(id=job_id, provider="claude", request_key=job_id,
                                          owner_instance=OWNER, hostname="elsewhere",
                                          request_json=json.dumps(request)), ttl_s=3600)
            await store.mark_running(job_id, OWNER, ttl_s=3600)
        await store.complete(DONE, OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, output="{}", output_bytes=2,
            result_json=json.dumps({"text": "an answer", "session_id": "s-1"})))

    cli.in_store(run)


@pytest.mark.parametrize("command", [("jobs", "list"), ("jobs", "show", DONE[:8]),
                                     ("jobs", "show", RUNNING[:8]), ("usage",)],
                         ids=["jobs list", "jobs show done", "jobs show running", "usage"])
def test_a_read_command_loads_no_mcp_http_or_job_machinery(sqlite_cli: Cli,
                                                           command: tuple[str, ...]) -> None:
    seed(sqlite_cli)
    code = PROBE.format(names=NOT_FOR_READING)
    done = subprocess.run([sys.executable, "-c", code, *command, "--config",
                           str(sqlite_cli.config)], cwd=sqlite_cli.home,
                          env=hermetic_env(sqlite_cli.home, {"PYTHONPATH": str(REPO)}),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "read me" in done.stdout or "usage" in command  # it did read the store
    loaded = done.stdout.splitlines()[-1]
    assert loaded == "LOADED -", f"`{' '.join(command)}` loaded what only serving needs: {loaded}"


# What serving loads of the operator's command line: the parser and the shared helpers,
# none of the other commands (each imports its own machinery: worktrees, the dashboard...).
SERVING_CLI = {"gateway.cli", "gateway.cli.arguments", "gateway.cli.common",
               "gateway.cli.main", "gateway.cli.version"}
SERVE_PROBE = ("import sys\n"
               "from gateway.entry import main\n"
               "code = main()\n"
               "print('LOADED', ' '.join(sorted(m for m in sys.modules\n"
               "                                if m.startswith('gateway.cli'))))\n"
               "sys.exit(code)\n")


def test_serving_loads_no_other_command(sqlite_cli: Cli) -> None:
    """Served over stdio until its stdin ends (at once): the first answer's imports."""
    done = subprocess.run([sys.executable, "-c", SERVE_PROBE, "--config",
                           str(sqlite_cli.config)], cwd=sqlite_cli.home,
                          env=hermetic_env(sqlite_cli.home, {"PYTHONPATH": str(REPO)}),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.splitlines()[-1].split()[1:])
    assert loaded == SERVING_CLI, f"serving loaded other commands: {loaded - SERVING_CLI}"


def test_serving_imports_no_store_module_before_its_first_answer(tmp_path: Path) -> None:
    """The store opens after the handshake (gateway/mcp/server.py): what the serving command
    line and the MCP front end import must not load it (nor the worktree machinery)."""
    code = ("import sys\n"
            "from gateway.cli.main import build_parser\n"
            "build_parser(commands=False)\n"
            "import gateway.mcp.serve\n"
            "print(' '.join(sorted(m for m in sys.modules\n"
            "                      if m.startswith(('gateway.store', 'gateway.jobs')))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          env=hermetic_env(tmp_path, {"PYTHONPATH": str(REPO)}),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=True)
    assert done.stdout.split() == [], done.stdout
