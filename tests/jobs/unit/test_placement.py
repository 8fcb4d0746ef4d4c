"""Where a job may run (gateway/jobs/placement.py, issue 42): what `runs_on` accepts, the
rule a host's published capabilities meet it by (the PostgreSQL claim's rule, in Python for
`unschedulable_reason`), and that one host (memory, SQLite) refuses a job for another host
with a clear error and stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gateway.jobs.placement import (
    HostCapabilities,
    live_hosts,
    meets,
    repo_names,
    stored_runs_on,
    unschedulable_reason,
    with_repo,
)
from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, GatewayError, InstanceRow
from gateway.store.memory.store import MemoryJobStore
from tests.jobs.unit.conftest import MakeManager, MakeSettings

pytestmark = pytest.mark.anyio

BUILDBOX = HostCapabilities(hostname="buildbox", providers=frozenset({"codex"}),
                            labels={"gpu": "true"}, accept_remote=True)


@pytest.mark.parametrize(("value", "stored"), [
    (None, None), ("here", None), ("any", '"any"'),
    ({"host": "buildbox"}, '{"host":"buildbox"}'),
    ({"labels": {"gpu": "true"}, "host": "b"}, '{"host":"b","labels":{"gpu":"true"}}'),
    ({"repo": "api"}, '{"repo":"api"}'),
])
def test_runs_on_is_stored_as_canonical_json_or_null_for_here(value: object,
                                                             stored: str | None) -> None:
    assert stored_runs_on(value) == stored


@pytest.mark.parametrize("value", [
    "everywhere", 3, [], {}, {"hosts": "b"}, {"host": ""}, {"host": 7}, {"labels": {}},
    {"labels": {"gpu": True}}, {"labels": "gpu"}, {"host": "x" * 2000}, {"repo": ""},
    {"repo": ["api"]},
])
def test_a_runs_on_that_is_none_of_the_forms_is_refused_saying_which_are(value: object) -> None:
    with pytest.raises(GatewayError) as caught:
        stored_runs_on(value)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "runs_on" in caught.value.message


@pytest.mark.parametrize(("runs_on", "provider", "met"), [
    ('"any"', "codex", True), ('"any"', "claude", False),
    ('{"host":"buildbox"}', "codex", True), ('{"host":"laptop"}', "codex", False),
    ('{"labels":{"gpu":"true"}}', "codex", True), ('{"labels":{"gpu":"false"}}', "codex", False),
    ('{"host":"buildbox","labels":{"gpu":"true","os":"mac"}}', "codex", False),
])
def test_a_host_meets_a_selector_only_when_every_key_matches(runs_on: str, provider: str,
                                                             met: bool) -> None:
    assert meets(BUILDBOX, provider, runs_on) is met


def test_a_host_that_takes_no_remote_work_or_is_logged_out_meets_nothing() -> None:
    closed = HostCapabilities(hostname="b", providers=frozenset({"codex"}), accept_remote=False)
    assert not meets(closed, "codex", '"any"')
    row = InstanceRow(instance_id="w", hostname="b", boot_id="x", pid=1, pid_started_at=None,
                      role="worker", version="0", capabilities=json.dumps({
                          "providers": {"codex": {"logged_in": "no"},
                                        "claude": {"logged_in": "cannot tell"}},
                          "accept_remote": True}))
    caps = HostCapabilities.of(row)
    assert caps is not None and caps.providers == frozenset({"claude"})


def test_the_reason_names_what_is_missing() -> None:
    assert unschedulable_reason("codex", '"any"', [BUILDBOX]) is None
    assert "claude" in (unschedulable_reason("claude", '"any"', [BUILDBOX]) or "")
    why = unschedulable_reason("codex", '{"labels":{"gpu":"false"}}', [BUILDBOX])
    assert why is not None and "gpu" in why
    assert unschedulable_reason("codex", '"any"', []) is not None


def test_only_live_instances_count() -> None:
    now = datetime.now(UTC)
    caps = json.dumps({"providers": {"codex": {"logged_in": "yes"}}, "accept_remote": True})

    def row(name: str, **changes: object) -> InstanceRow:
        fields: dict[str, object] = dict(
            instance_id=name, hostname=name, boot_id="x", pid=1, pid_started_at=None,
            role="worker", version="0", capabilities=caps,
            lease_expires_at=now + timedelta(seconds=30))
        fields.update(changes)
        return InstanceRow(**fields)  # type: ignore[arg-type]

    rows = [row("live"), row("stopped", stopped_at=now),
            row("lapsed", lease_expires_at=now - timedelta(seconds=1)),
            row("no-caps", capabilities=None)]
    assert [h.hostname for h in live_hosts(rows, now.timestamp())] == ["live"]


async def test_one_host_refuses_a_job_for_another_host_and_stores_nothing(
        unit_settings: MakeSettings, managers: MakeManager, store: MemoryJobStore) -> None:
    manager = managers(unit_settings())
    with pytest.raises(GatewayError) as caught:
        await manager.submit("claude", SubmitRequest(prompt="elsewhere", runs_on="any"))
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "PostgreSQL" in caught.value.message
    assert await store.list_jobs() == []


def test_a_worktree_job_needs_a_host_holding_its_repo() -> None:
    assert with_repo('"any"', "git@x:api.git") == '{"repo":"git@x:api.git"}'
    assert with_repo('{"host":"buildbox"}', "api") == '{"host":"buildbox","repo":"api"}'
    assert with_repo('{"repo":"api"}', "api") == '{"repo":"api"}'
    published = {"repos": ["api"], "origins": {"api": "git@x:api.git"}}
    assert repo_names(published) == ["api", "git@x:api.git"]
    holder = HostCapabilities(hostname="buildbox", providers=frozenset({"codex"}),
                              accept_remote=True, repos=frozenset(repo_names(published)))
    assert meets(holder, "codex", '{"repo":"git@x:api.git"}')
    assert meets(holder, "codex", '{"repo":"api"}')
    assert not meets(BUILDBOX, "codex", '{"repo":"api"}')
    why = unschedulable_reason("codex", '{"repo":"web"}', [holder])
    assert why is not None and "web" in why
