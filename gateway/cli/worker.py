"""`worker`: a gateway without an MCP front end that runs jobs admitted on other hosts
(issue 42, docs/operations.md "A team and its build boxes").

It is the same runtime as `serve` (store, manager, lease keeper: the ordinary lease,
heartbeat, cancel, adoption and re-queue rules), plus a claim loop (gateway/jobs/claims.py)
that publishes this host's capabilities and claims the queued jobs whose `runs_on` it meets.
PostgreSQL only: on SQLite no other host can see the jobs. It takes remote work only with
`[worker] accept_remote = true`. Logs go to stderr; it prints nothing to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import structlog

from gateway import __version__, platform, proc
from gateway.childenv import secret_env_names
from gateway.cli.arguments import CommandTree, positive_int
from gateway.cli.common import EXIT_OK, EXIT_USAGE, CliError, load
from gateway.cli.doctor_auth import check_login
from gateway.config import Settings
from gateway.jobs.worktrees.remote import origin_url
from providers.registry import CLI_PROVIDERS, provider_binary

log = structlog.get_logger(__name__)

# Read from the environment once, at start, then kept from every child (as `serve` does).
WORKER_SECRET_ENV = ("AGENT_GATEWAY_PERSISTENCE__DSN",)


def add_parsers(tree: CommandTree) -> None:
    """`worker [--label KEY=VALUE]... [--max-jobs N]`."""
    worker = tree.add(
        "worker", help="run jobs that other hosts submit (PostgreSQL)",
        description="Run as a worker host: publish the CLIs found and logged in here, and "
                    "run the queued jobs of other gateways whose runs_on this host meets. "
                    "Needs the shared PostgreSQL store and [worker] accept_remote = true.")
    worker.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        type=_label, help="a label runs_on selectors match (repeatable; "
                                          "added to [worker] labels)")
    worker.add_argument("--max-jobs", type=positive_int, default=None, metavar="N",
                        help="jobs run at once (default: [worker] max_jobs)")
    worker.set_defaults(handler=cmd_worker)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def worker_settings(args: argparse.Namespace) -> Settings:
    """The settings with the command line's labels and max jobs; CliError (exit 2) when
    this gateway cannot be a worker."""
    settings = load(args, quiet=False)
    if settings.persistence.backend != "postgres":
        raise CliError(
            f"a worker needs the PostgreSQL store that the submitting gateways share "
            f"([persistence] backend = \"postgres\" and its dsn); this config uses "
            f"{settings.persistence.backend}, which only this host can see, so no job of "
            f"another host could ever reach it.", EXIT_USAGE)
    if not settings.worker.accept_remote:
        raise CliError("this worker would take no job: set [worker] accept_remote = true "
                       "(or AGENT_GATEWAY_WORKER__ACCEPT_REMOTE=true) to run jobs that other "
                       "hosts submit; [worker] principals limits whose.", EXIT_USAGE)
    worker = settings.worker.model_copy(update={
        "labels": {**settings.worker.labels, **dict(args.label)},
        "max_jobs": args.max_jobs or settings.worker.max_jobs})
    return settings.model_copy(update={"worker": worker})


def host_capabilities(settings: Settings) -> dict[str, Any]:
    """What this host can run now, as published on its instance row: each enabled CLI
    found here (PATH plus the user bin dirs) and whether it is logged in (the doctor's
    offline checks, never a model call), each configured API provider, and the host's
    facts. Blocking (a status command may run): call it in a thread."""
    search = os.environ.get("PATH", "")
    secret_env = secret_env_names(settings)
    providers: dict[str, dict[str, Any]] = {}
    for name, config in settings.providers.items():
        if name not in CLI_PROVIDERS or not config.enabled:
            continue
        path = provider_binary(name, config.command, search)
        if path is None:
            continue
        finding = check_login(name, str(path), config, secret_env)
        providers[name] = {"logged_in": finding.logged_in}
    for name in settings.api_providers:
        providers[name] = {"logged_in": "cannot tell", "api": True}
    worker = settings.worker
    return {"hostname": proc.hostname(), "os": sys.platform,
            "platform": platform.choose(), "version": __version__,
            "providers": providers, "labels": dict(worker.labels),
            "repos": sorted(worker.repos),
            "origins": {name: origin_url(path) for name, path in sorted(worker.repos.items())},
            "accept_remote": worker.accept_remote,
            "max_jobs": worker.max_jobs}


def capability_reader(settings: Settings) -> Callable[[], Awaitable[Mapping[str, Any]]]:
    """What a gateway that claims remote jobs (a worker, or `serve` with [worker]
    accept_remote on PostgreSQL) reads of this host, off the event loop."""

    async def read() -> Mapping[str, Any]:
        return await anyio.to_thread.run_sync(host_capabilities, settings)

    return read


def cmd_worker(args: argparse.Namespace) -> int:
    settings = worker_settings(args)
    proc.keep_secrets_from_children(WORKER_SECRET_ENV)
    return asyncio.run(run_worker(settings))


async def run_worker(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT, then leave as lease.on_shutdown says (detach by
    default: the runs go on under their supervisors and the next worker here adopts them)."""
    from gateway.runtime import Gateway  # deferred: start-up

    gateway = Gateway(settings, role="worker", read_capabilities=capability_reader(settings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gateway.start_in_background()
    log.info("worker starting", action="worker", labels=settings.worker.labels,
             max_jobs=settings.worker.max_jobs)
    try:
        await stop.wait()
    finally:
        log.info("worker stopping", action="worker")
        await gateway.stop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_IGN)  # handled until the process has exited
    return EXIT_OK
