"""Per-call figures of issue #45 side by side in one run: this gateway, the anchor
(llm-cli-gateway, a Node program built from its tag) and the SDK's minimal server.

Each server is started as an MCP client starts it (stdio, a fresh HOME, the fake CLIs of
tests/fakes/bin first on PATH) and asked through the same Python SDK client. Each gateway
runs one instant `claude_request_async` job to its end; then, interleaved call by call:

- the minimal server's no-op tool (the SDK's floor: what any Python MCP server pays);
- `llm_job_status` of the finished job, on this gateway and on the anchor;
- `llm_job_result` of it, on both;

and bursts of `--burst` status calls sent at once on one session (`asyncio.gather`), in
turns. Medians; every ratio is to the minimal server's no-op in the same run (issue #45:
round trips <= 1.3x the SDK's no-op), with the anchor's ratio beside ours.

Then the rows of the issue's table that are not round trips, each gateway fresh:

- a sync `claude_request` of the instant fake minus the fake spawned directly (the argv
  this gateway's adapter builds), `--sync` of each in turns;
- `--jobs` back-to-back `claude_request_async` calls: calls/s, and the time until all are
  terminal (this gateway: `llm_job_wait` per job; the anchor: `llm_job_status` polled);
- the server process's RSS idle (after the listing) and after those jobs.

    uv run python bench/anchor_bench.py \\
        --anchor "node <anchor checkout>/dist/index.js" [--python <user-venv>/bin/python]

The startup row is bench/first_answer.py's (raw JSON-RPC, any server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from bench import runner_bench
from bench.run import Servers, _direct_argv, call, wait_done

WARMUP = 20  # first calls pay for imports and statement preparation
ANCHOR_DONE_S = 30.0  # the anchor's instant fake job ends well within this
POLL_S = 0.05


def anchor_text(result: Any) -> dict[str, Any]:
    """The anchor answers with JSON in its text content (no structured content)."""
    if result.is_error:
        raise RuntimeError(f"the anchor refused: {result.content}")
    return dict(json.loads(result.content[0].text))


async def anchor_finished_job(client: Client) -> str:
    """An instant fake job on the anchor, polled until it has ended."""
    job_id = await _anchor_submit(client, f"anchor {uuid.uuid4().hex[:8]}")
    await anchor_wait_all(client, [job_id])
    return job_id


async def ours_finished_job(client: Client) -> str:
    submitted = await call(client, "claude_request_async",
                           {"prompt": f"ours {uuid.uuid4().hex[:8]}", "force_refresh": True})
    await wait_done(client, submitted["job_id"])
    return str(submitted["job_id"])


Call = Callable[[], Awaitable[object]]  # one call, raising if it failed


async def timed(calls: dict[str, Call], rounds: int) -> dict[str, list[float]]:
    """Each call once per round, in turns; seconds of each after WARMUP rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(WARMUP + rounds):
        for name, one in calls.items():
            started = time.perf_counter()
            await one()
            if i >= WARMUP:
                times[name].append(time.perf_counter() - started)
    return times


async def bursts(calls: dict[str, Call], size: int, rounds: int) -> dict[str, list[float]]:
    """`size` calls at once on one session, each server in turns; calls/s (first untimed)."""
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(rounds + 1):
        for name, one in calls.items():
            started = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(size)))
            if i:
                rates[name].append(size / (time.perf_counter() - started))
    return rates


async def anchor_wait_all(client: Client, job_ids: list[str]) -> None:
    for job_id in job_ids:
        deadline = time.monotonic() + ANCHOR_DONE_S
        while True:
            status = anchor_text(await client.call_tool("llm_job_status", {"jobId": job_id}))
            if status["job"]["status"] not in ("running", "queued", "pending"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the anchor's job {job_id} did not end in time")
            await asyncio.sleep(POLL_S)


async def jobs_rows(servers: Servers, ours_params: StdioServerParameters,
                    anchor: StdioServerParameters, args: argparse.Namespace,
                    ) -> dict[str, Any]:
    """Sync overhead over a direct spawn, then admission, all-terminal and RSS, each gateway
    fresh (its own store); the sync pairs in turns on both at once."""
    config = Path(ours_params.env["AGENT_GATEWAY_CONFIG"]) if ours_params.env else None
    assert config is not None
    result: dict[str, Any] = {"sync_ms": {"direct": [], "ours": [], "anchor": []}}
    async with servers.connect(ours_params, "ours-jobs") as (ours, ours_proc), \
            servers.connect(anchor, "anchor-jobs") as (node, node_proc):
        await ours.list_tools()
        await node.list_tools()
        await call(ours, "llm_job_list", {})  # the store is open
        await asyncio.sleep(1.0)
        result["rss_idle_mb"] = {"ours": ours_proc.memory_info().rss / 1e6,
                                 "anchor": node_proc.memory_info().rss / 1e6}
        for i in range(3 + args.sync):
            prompt = f"sync {uuid.uuid4().hex[:8]}"
            argv, stdin = _direct_argv(config, prompt)
            direct = await runner_bench._direct_once(argv, stdin, servers.workdir / "direct")
            started = time.perf_counter()
            await call(ours, "claude_request", {"prompt": prompt, "force_refresh": True})
            mine = time.perf_counter() - started
            started = time.perf_counter()
            await call(node, "claude_request", {"prompt": prompt})
            theirs = time.perf_counter() - started
            if i >= 3:
                for name, value in (("direct", direct), ("ours", mine), ("anchor", theirs)):
                    result["sync_ms"][name].append(value * 1000)
        prompts = [f"jobs {i} {uuid.uuid4().hex[:8]}" for i in range(args.jobs)]
        started = time.perf_counter()
        ours_ids = [str((await call(ours, "claude_request_async",
                                    {"prompt": p, "force_refresh": True}))["job_id"])
                    for p in prompts]
        admitted = time.perf_counter() - started
        for job_id in ours_ids:
            await wait_done(ours, job_id)
        result["ours_jobs"] = {"calls_per_s": args.jobs / admitted,
                               "terminal_s": time.perf_counter() - started}
        started = time.perf_counter()
        node_ids = [await _anchor_submit(node, p) for p in prompts]
        admitted = time.perf_counter() - started
        await anchor_wait_all(node, node_ids)
        result["anchor_jobs"] = {"calls_per_s": args.jobs / admitted,
                                 "terminal_s": time.perf_counter() - started}
        result["rss_after_jobs_mb"] = {"ours": ours_proc.memory_info().rss / 1e6,
                                       "anchor": node_proc.memory_info().rss / 1e6}
    return result


async def _anchor_submit(client: Client, prompt: str) -> str:
    job = anchor_text(await client.call_tool("claude_request_async", {"prompt": prompt}))
    return str(job["job"]["id"])


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="anchor-bench-"))
    servers = Servers(workdir)
    anchor_argv = shlex.split(args.anchor)
    anchor = StdioServerParameters(command=anchor_argv[0], args=anchor_argv[1:],
                                   env=servers._env(), cwd=str(servers.home))
    if args.jobs_only:
        return {"jobs": await jobs_rows(servers, servers.gateway(servers.config(),
                                                                 args.python), anchor, args)}
    async with servers.connect(servers.minimal(args.python), "minimal") as (minimal, _), \
            servers.connect(servers.gateway(servers.config(), args.python), "ours") as (
                ours, _), \
            servers.connect(anchor, "anchor") as (node, _):
        await ours.list_tools()
        await node.list_tools()
        ours_job = await ours_finished_job(ours)
        node_job = await anchor_finished_job(node)
        noop: Call = lambda: call(minimal, "noop", {})  # noqa: E731
        calls: dict[str, Call] = {
            "noop": noop,
            "ours_status": lambda: call(ours, "llm_job_status", {"job_id": ours_job}),
            "anchor_status": lambda: call(node, "llm_job_status", {"jobId": node_job}),
            "ours_result": lambda: call(ours, "llm_job_result", {"job_id": ours_job}),
            "anchor_result": lambda: call(node, "llm_job_result", {"jobId": node_job}),
        }
        times = await timed(calls, args.rounds)
        rates = await bursts({"noop": noop, "ours_status": calls["ours_status"],
                              "anchor_status": calls["anchor_status"]},
                             args.burst, args.burst_rounds)
    medians = {name: statistics.median(values) * 1000 for name, values in times.items()}
    per_s = {name: statistics.median(values) for name, values in rates.items()}
    jobs = await jobs_rows(servers, servers.gateway(servers.config(), args.python), anchor,
                           args)
    return {"rounds": args.rounds, "median_ms": medians, "burst_per_s": per_s,
            "burst": args.burst, "jobs": jobs}


def jobs_report(jobs: dict[str, Any]) -> list[str]:
    sync = {name: statistics.median(values) for name, values in jobs["sync_ms"].items()}
    lines = [f"{'figure':<44}{'ours':>12}{'anchor':>12}{'ours/anchor':>13}"]
    o, a = sync["ours"] - sync["direct"], sync["anchor"] - sync["direct"]
    lines.append(f"{'sync claude_request minus a direct spawn (ms)':<44}{o:>+12.1f}{a:>+12.1f}"
                 f"{o / a:>13.3f}   (direct {sync['direct']:.1f} ms)")
    o, a = jobs["ours_jobs"]["calls_per_s"], jobs["anchor_jobs"]["calls_per_s"]
    lines.append(f"{'async jobs admitted back to back (calls/s)':<44}{o:>12.1f}{a:>12.1f}"
                 f"{o / a:>13.3f}")
    o, a = jobs["ours_jobs"]["terminal_s"], jobs["anchor_jobs"]["terminal_s"]
    lines.append(f"{'...until all are terminal (s)':<44}{o:>12.2f}{a:>12.2f}{o / a:>13.3f}")
    for key, label in (("rss_idle_mb", "RSS idle (MB)"),
                       ("rss_after_jobs_mb", "RSS after the jobs (MB)")):
        o, a = jobs[key]["ours"], jobs[key]["anchor"]
        lines.append(f"{label:<44}{o:>12.1f}{a:>12.1f}{o / a:>13.3f}")
    return lines


def report(result: dict[str, Any]) -> str:
    if "median_ms" not in result:
        return "\n".join(jobs_report(result["jobs"]))
    ms, per_s = result["median_ms"], result["burst_per_s"]
    noop = ms["noop"]
    lines = [f"medians of {result['rounds']} rounds in turns; x = over the SDK's no-op",
             f"{'figure':<34}{'ours':>12}{'anchor':>12}{'ours x':>9}{'anchor x':>10}"
             f"{'ours/anchor':>13}"]
    for what in ("status", "result"):
        o, a = ms[f"ours_{what}"], ms[f"anchor_{what}"]
        lines.append(f"{'llm_job_' + what + ' round trip (ms)':<34}{o:>12.2f}{a:>12.2f}"
                     f"{o / noop:>9.3f}{a / noop:>10.3f}{o / a:>13.3f}")
    lines.append(f"{'no-op round trip (ms)':<34}{noop:>12.2f}")
    o, a, n = per_s["ours_status"], per_s["anchor_status"], per_s["noop"]
    burst = f"burst of {result['burst']} status calls (/s)"
    lines.append(f"{burst:<34}{o:>12.0f}{a:>12.0f}"
                 f"{o / n:>9.3f}{a / n:>10.3f}{o / a:>13.3f}")
    lines.append(f"{'burst of no-op calls (/s)':<34}{n:>12.0f}")
    return "\n".join([*lines, "", *jobs_report(result["jobs"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", required=True,
                        help='the anchor\'s command line, e.g. "node <checkout>/dist/index.js"')
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter for this gateway and the minimal server")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-rounds", type=int, default=5)
    parser.add_argument("--sync", type=int, default=20, help="sync request pairs")
    parser.add_argument("--jobs", type=int, default=200, help="async jobs per gateway")
    parser.add_argument("--jobs-only", action="store_true",
                        help="only the sync, admission and RSS rows")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
