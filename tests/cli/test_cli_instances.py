"""`instances` as a subprocess: every instance of the store, its lease state, its jobs."""

from __future__ import annotations

import json
from typing import Any

from gateway.cli.common import command
from gateway.model import InstanceRow, NewJob
from tests.cli.cli_support import Cli


def test_instances_shows_each_instance_its_lease_state_and_its_active_jobs(cli: Cli) -> None:
    async def seed(store: Any) -> None:
        def instance(name: str, role: str) -> InstanceRow:
            return InstanceRow(instance_id=name, hostname=f"host-{name}", boot_id="b",
                               pid=100 + len(name), pid_started_at=None, role=role,
                               version="9.9")

        await store.register_instance(instance("live", "http"), ttl_s=3600)
        # Its heartbeat writes the worst renewal wait of its last hour (#22).
        assert await store.heartbeat("live", 3600, renewal_wait_ms=1234.4) == 1
        await store.register_instance(instance("lapsed", "stdio"), ttl_s=-60)
        await store.register_instance(instance("stopping", "stdio"), ttl_s=3600)
        await store.mark_instance_stopped("stopping")
        await store.register_instance(instance("stopped", "cli"), ttl_s=-60)
        await store.mark_instance_stopped("stopped")
        for n in range(2):
            await store.insert_job(NewJob(id=f"job-{n}", provider="claude",
                                          request_key=f"k{n}", owner_instance="live"), 3600)

        # A lapsed instance that still owns a job is shown without --all too.
        await store.register_instance(instance("lapsed-owner", "stdio"), ttl_s=-60)
        await store.insert_job(NewJob(id="job-orphan-to-be", provider="codex",
                                      request_key="k-lapsed", owner_instance="lapsed-owner"),
                               3600)

    cli.in_store(seed)
    done = cli.run("instances", "--json", "--all")
    assert done.returncode == 0, done.stderr
    found = {i["instance_id"]: i for i in json.loads(done.stdout)}
    assert {name: i["lease_state"] for name, i in found.items()} == {
        "live": "live", "lapsed": "lapsed", "stopping": "stopping", "stopped": "stopped",
        "lapsed-owner": "lapsed"}
    # By default: the live ones and those whose jobs still need them (#25).
    default = {i["instance_id"] for i in json.loads(cli.run("instances", "--json").stdout)}
    assert default == {"live", "stopping", "lapsed-owner"}
    assert found["live"]["active_jobs"] == 2 and found["lapsed"]["active_jobs"] == 0
    assert found["live"]["hostname"] == "host-live" and found["live"]["role"] == "http"
    assert found["live"]["version"] == "9.9" and found["live"]["pid"] == 104
    assert found["live"]["last_heartbeat"].endswith("Z")
    assert found["live"]["renewal_wait_ms_max_1h"] == 1234.4
    assert found["lapsed"]["renewal_wait_ms_max_1h"] is None

    text = cli.run("instances")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["INSTANCE", "HOST", "PID", "ROLE", "VERSION", "HEARTBEAT",
                                "RENEWAL", "LEASE", "JOBS"]
    live = next(line for line in lines if line.startswith("live "))
    assert live.split()[-3:] == ["1234ms", "live", "2"] and "ago" in live
    lapsed = next(line for line in lines if line.startswith("lapsed-owner "))
    assert lapsed.split()[-3:] == ["-", "lapsed", "1"]
    assert not any(line.startswith(("stopped ", "lapsed ")) for line in lines)
    assert lines[-1] == ("(2 stopped or lapsed without jobs not shown: "
                         f"`{command()} instances --all`)")
    every = cli.run("instances", "--all").stdout.splitlines()
    assert any(line.startswith("stopped ") for line in every) and "not shown" not in every[-1]


def test_instances_of_a_store_not_created_yet_says_so(home: Any) -> None:
    from tests.cli.cli_support import write_config

    cli = Cli(home, write_config(home, f'[persistence]\npath = "{home / "none.db"}"\n'), "sqlite")
    done = cli.run("instances")
    assert done.returncode == 0 and "No gateway instances" in done.stdout
    assert json.loads(cli.run("instances", "--json").stdout) == []
    assert not (home / "none.db").exists()
