"""`instances`: the gateway instances that share this store, and the jobs each owns (the
live ones and any that still own jobs; `--all`: every row until the instances GC).

Lease state uses the reaper's one rule (gateway.jobs.on_read.instance_lease_held): `live`
(lease held, not stopped), `stopping` (stopped, lease not yet lapsed: its jobs are still
covered), `stopped`, or `lapsed` (it stopped renewing without saying goodbye: its jobs are
orphaned by the next sweep of any live instance). RENEWAL is the worst wait of a lease
renewal in the instance's last hour (issue #22).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.cli.arguments import CommandTree
from gateway.cli.common import EXIT_OK, command, run, store_settings, with_store
from gateway.cli.format import ago, iso, table, terminal_columns, use_colour
from gateway.model import ACTIVE_STATUSES, InstanceRow
from gateway.store.base import JobStore

OWNED_COUNT_LIMIT = 100_000  # active jobs counted per instance (far above any max_queued_jobs)
STATE_COLOURS = {"live": "\033[32m", "stopping": "\033[33m", "stopped": "\033[2m",
                 "lapsed": "\033[31m"}


def lease_state(instance: InstanceRow, now: float) -> str:
    # The job machinery: only this command loads it.
    from gateway.jobs.on_read import instance_lease_state  # deferred: start-up

    return instance_lease_state(instance, now)


async def _gather(store: JobStore) -> tuple[list[tuple[InstanceRow, int]], float]:
    now = await store.now()
    found = []
    for instance in await store.list_instances():
        owned = await store.list_jobs(statuses=sorted(ACTIVE_STATUSES),
                                      owner_instance=instance.instance_id,
                                      limit=OWNED_COUNT_LIMIT, with_output=False)
        found.append((instance, len(owned)))
    return found, now


def renewal_wait(instance: InstanceRow) -> str:
    """The RENEWAL column: the worst lease renewal wait of the instance's last hour, as its
    heartbeat wrote it (the gauge `gateway_status` shows): a slow store or a full pool shows
    here long before a lease lapses. "-": not measured yet, or a gateway before schema 7."""
    wait = instance.renewal_wait_ms_max_1h
    return "-" if wait is None else f"{wait:.0f}ms"


def capabilities(instance: InstanceRow) -> dict[str, Any] | None:
    """What a worker published it can run (None: a gateway that publishes nothing)."""
    try:
        data = json.loads(instance.capabilities) if instance.capabilities else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def capability_line(caps: dict[str, Any]) -> str:
    """One line: its providers (and their login), labels, repos, whether it takes remote
    work."""
    providers = caps.get("providers") or {}
    names = ", ".join(f"{name} (logged in: {facts.get('logged_in')})"
                      for name, facts in sorted(providers.items()) if isinstance(facts, dict))
    labels = ", ".join(f"{k}={v}" for k, v in sorted((caps.get("labels") or {}).items()))
    parts = [names or "no provider", f"os {caps.get('os')}"]
    if labels:
        parts.append(f"labels {labels}")
    if caps.get("repos"):
        parts.append(f"repos {', '.join(map(str, caps['repos']))}")
    parts.append("accepts remote jobs" if caps.get("accept_remote") else "no remote jobs")
    return "; ".join(parts)


def worth_showing(instance: InstanceRow, owned: int, now: float) -> bool:
    """Shown without --all: a live instance, one whose lease still covers its jobs, and any
    that still owns active jobs (a lapsed one with jobs is what an operator looks for).
    Stopped rows stay until the instances GC (an hour): after a day of client restarts
    they would be most of the table."""
    return owned > 0 or lease_state(instance, now) in ("live", "stopping")


def add_parsers(tree: CommandTree) -> None:
    """`instances [--all] [--json]`."""
    instances = tree.add("instances", help="the gateway instances that share the store")
    instances.add_argument("--all", action="store_true",
                           help="also the stopped and lapsed instances that own no job")
    instances.add_argument("--json", action="store_true", help="print them as JSON")
    instances.set_defaults(handler=cmd_instances)


def cmd_instances(args: argparse.Namespace) -> int:
    settings = store_settings(args)
    everything, now = run(with_store, settings, _gather) if settings else ([], 0.0)
    found = everything if args.all else [
        (instance, owned) for instance, owned in everything if worth_showing(instance, owned, now)]
    hidden = len(everything) - len(found)
    if args.json:
        print(json.dumps([{
            "instance_id": i.instance_id, "hostname": i.hostname, "boot_id": i.boot_id,
            "pid": i.pid, "role": i.role, "version": i.version,
            "started_at": iso(i.started_at), "last_heartbeat": iso(i.heartbeat_at),
            "lease_expires_at": iso(i.lease_expires_at), "stopped_at": iso(i.stopped_at),
            "lease_state": lease_state(i, now), "active_jobs": owned,
            "renewal_wait_ms_max_1h": i.renewal_wait_ms_max_1h,
            "capabilities": capabilities(i),
        } for i, owned in found], indent=2))
        return EXIT_OK
    if not found:
        if hidden:
            print(f"No live gateway instance; {hidden} stopped or lapsed (show them with "
                  f"`{command()} instances --all`).")
        else:
            print("No gateway instances (none has started on this store yet, or all were "
                  "collected after they stopped).")
        return EXIT_OK
    colour = use_colour()
    header = ("INSTANCE", "HOST", "PID", "ROLE", "VERSION", "HEARTBEAT", "RENEWAL", "LEASE",
              "JOBS")
    rows, colours = [], []
    for instance, owned in found:
        state = lease_state(instance, now)
        rows.append((instance.instance_id, instance.hostname, str(instance.pid), instance.role,
                     instance.version, ago(instance.heartbeat_at, now),
                     renewal_wait(instance), state, str(owned)))
        colours.append(("", "", "", "", "", "", "", STATE_COLOURS[state] if colour else "", ""))
    for line in table(header, rows, width=terminal_columns(), colours=colours):
        print(line)
    for instance, _ in found:
        caps = capabilities(instance)
        if caps is not None:
            print(f"{instance.instance_id} can run: {capability_line(caps)}")
    if hidden:
        print(f"({hidden} stopped or lapsed without jobs not shown: `{command()} instances --all`)")
    return EXIT_OK
