"""Finalize a run whose gateway is gone: the terminal row is written with no gateway alive
(docs/architecture.md, Instance leases: a run's end is recorded with no gateway alive).

A supervisor whose run ended while its gateway was gone (a closed window with the default
`on_shutdown = "detach"`) starts `python -m gateway finalize <spool dir>`: this module, run
once, through the normal store and completion path (the adopter's take-over and the
manager's finalize, exactly as the next gateway on the host would), then it exits. No MCP,
no loops: it registers an instance row (role `finalizer`) for the CAS on owner_instance,
marks it stopped at the end, and settles only that run.

How it gets its configuration: the gateway that launched the run hands the supervisor its
effective settings through the same pipe the run's environment takes (never a file, never
argv: they may hold a DSN password), and the supervisor passes them on the finalizer's
stdin. `handoff()` builds that message; `settings_from_handoff()` reads it back.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import structlog

from gateway import __version__, platform, proc
from gateway.config import Settings
from gateway.jobs.adoption import Adopter
from gateway.jobs.manager import JobManager
from gateway.jobs.notify.deliver import Deliverer
from gateway.jobs.run import supervisor as sup
from gateway.jobs.run.spool import remove_job_dir, run_dir, spool_root
from gateway.model import FINAL_STATUSES, InstanceRow, JobStatus
from gateway.store import open_store
from gateway.store.base import JobStore

log = structlog.get_logger(__name__)

ROLE = "finalizer"
# How long the finalizer waits for the adopted run's terminal write (it reads an end record
# that is already there: normally milliseconds; a store that is slow or down gets longer).
FINALIZE_TIMEOUT_S = 60.0
# How long a finalizer spends delivering notices after its write (a sink that is down is
# retried by the next gateway, not waited for here).
NOTICE_DRAIN_S = 30.0
# The settings sections a finalizer needs: the store, the lease (its take-over CAS), limits
# (the output cap), logging and the CLI providers (parsing the answer). Not [http] (its bearer
# token) nor [api_providers] (an HTTP call has no supervisor).
HANDOFF_SECTIONS = ("persistence", "lease", "limits", "logging", "providers", "notify")
# The environment a finalizer needs to start the gateway's own code the way it was started,
# on its gateway's platform implementation: a forced `portable` reads another boot id than
# `linux`, and the finalizer would then take its own host's gone owner for another host's.
HANDOFF_ENV = ("HOME", "PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV",
               "PYTHONPATH", "XDG_STATE_HOME", "XDG_CONFIG_HOME", platform.ENV_VAR)


def handoff(settings: Settings) -> dict[str, Any]:
    """What a supervisor needs to start this gateway's finalizer once its run ended and this
    gateway is gone: the interpreter and module, an environment, the settings (for its
    stdin), and this gateway's pid and start time (how the supervisor knows it is gone)."""
    data = settings.model_dump(mode="json", include=set(HANDOFF_SECTIONS))
    return {
        "version": sup.RECORD_VERSION,
        "argv": [sys.executable, "-m", "gateway", "finalize"],
        "env": {name: os.environ[name] for name in HANDOFF_ENV if name in os.environ},
        "settings": json.dumps(data),
        "gateway_pid": os.getpid(),
        "gateway_started_at": proc.process_start_time(os.getpid()),
    }


def settings_from_handoff(text: str) -> Settings:
    """The settings a finalizer got on its stdin (handoff()'s `settings`)."""
    return Settings.model_validate(json.loads(text))


async def finalize_run(settings: Settings, spool_dir: Path, store: JobStore | None = None) -> str:
    """Settle the job of the run in `spool_dir` if its owner is gone; returns what happened
    (`finalized`, or why nothing was done: a live owner finalizes it itself). On `store`
    if given (left open), else on one opened and closed here."""
    spec = sup.read_record(spool_dir, sup.RUN_NAME)
    if spec is None or not isinstance(spec.get("job_id"), str):
        _remove_remains(spool_dir, spool_root(settings.state_dir))
        return "no run here"
    if store is not None:
        return await _finalize_on(settings, spool_dir, spec["job_id"], store)
    store = await open_store(settings)
    try:
        return await _finalize_on(settings, spool_dir, spec["job_id"], store)
    finally:
        await store.close()


def _remove_remains(spool_dir: Path, root: Path) -> None:
    """Remove an attempt dir that holds nothing but the run's log: what a terminal writer's
    rmtree left when the zygote created this finalizer's log file in it mid-removal (the
    PgBouncer chaos run). A run's dir has its run record from before its launch on, so a
    dir without one, log aside, is nobody's."""
    try:
        if {entry.name for entry in spool_dir.iterdir()} <= {sup.LOG_NAME}:
            shutil.rmtree(spool_dir, ignore_errors=True)
            if spool_dir.parent != root:
                spool_dir.parent.rmdir()  # the job's dir, if this was its last attempt
    except OSError:
        pass


async def _finalize_on(settings: Settings, spool_dir: Path, job_id: str, store: JobStore) -> str:
    row = await store.get_job(job_id, with_output=False)
    if row is None or not row.status.is_active:
        if row is not None and row.status in FINAL_STATUSES:
            # Its terminal writer was killed between its write and its removal of the
            # spool: the reaper's rule (LeaseKeeper._remove_settled_spools), applied now.
            await asyncio.to_thread(remove_job_dir, spool_root(settings.state_dir), job_id)
        return "already settled"
    if row.status is not JobStatus.RUNNING or sup.read_record(spool_dir, sup.END_NAME) is None:
        return "its run has not ended"  # a finalizer never starts or re-queues work
    hostname, boot_id = proc.hostname(), proc.boot_id()
    identity = InstanceRow(
        instance_id=str(uuid.uuid4()), hostname=hostname, boot_id=boot_id,
        pid=os.getpid(), pid_started_at=proc.process_start_time(os.getpid()), role=ROLE,
        version=__version__)
    manager = JobManager(settings, store, identity.instance_id, hostname, boot_id)
    if run_dir(manager.spool_root, row).resolve() != spool_dir.resolve():
        return "another attempt of this job is current"
    adopter = Adopter(manager, store, identity, manager.spool_root)
    owners = {i.instance_id: i for i in await store.list_instances()}
    if not adopter.owner_gone(owners.get(row.owner_instance or "")):
        return "its owner is alive"
    await store.register_instance(identity, settings.lease.ttl_s)
    try:
        if not await adopter.settle(row):
            return "not taken over (another gateway won, or it cannot be read)"
        async with asyncio.timeout(FINALIZE_TIMEOUT_S):
            while job_id in manager.local_job_ids():
                await asyncio.sleep(0.02)
        await _deliver_notices(settings, store, identity.instance_id)
    finally:
        await store.mark_instance_stopped(identity.instance_id)
    return "finalized"


async def _deliver_notices(settings: Settings, store: JobStore, instance_id: str) -> None:
    """No gateway is alive to tell of the end just written: the finalizer delivers the due
    notices itself (its job's among them), bounded; what it cannot finish stays due for
    the next gateway (a claim it held lapses)."""
    try:
        async with asyncio.timeout(NOTICE_DRAIN_S):
            await Deliverer(settings, store, instance_id).drain()
    except Exception as exc:  # the terminal row is written: a notice is never worth failing it
        log.warning("finalizer: notice delivery left to the next gateway",
                    action="deliver_notices", error=repr(exc))

