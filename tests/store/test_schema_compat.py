"""Which gateway may write a store (issue #22, store/compat.py), on SQLite and PostgreSQL.

A store records its schema version and the lowest gateway version that may write it; a
gateway older than that refuses at once, naming both versions and the upgrade, before it
writes anything. One that may still write keeps serving, even on a schema newer than it
knows. The stores are real (a SQLite file, the throwaway PostgreSQL server); what an older
or newer gateway would have written is put there with plain SQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway import __version__
from gateway.model import InstanceRow, NewJob
from gateway.store import compat
from gateway.store.base import SCHEMA_VERSION, JobStore, StoreUnavailable
from gateway.store.postgres.store import PostgresJobStore
from gateway.store.sqlite.store import SqliteJobStore

pytestmark = pytest.mark.anyio

TTL_S = 60.0


class RawStore:
    """Plain SQL on the test's storage, beside the gateway's own connections."""

    def __init__(self, backend: str, where: str) -> None:
        self.backend = backend
        self.where = where

    def gateway_store(self) -> JobStore:
        if self.backend == "sqlite":
            return SqliteJobStore(Path(self.where))
        return PostgresJobStore(self.where, max_size=2)

    async def execute(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.where, isolation_level=None)
            try:
                return [tuple(row) for row in conn.execute(sql.replace("$1", "?").replace(
                    "$2", "?"), args).fetchall()]
            finally:
                conn.close()
        pg = await asyncpg.connect(self.where)
        try:
            return [tuple(row) for row in await pg.fetch(sql, *args)]
        finally:
            await pg.close()

    async def set_meta(self, key: str, value: str) -> None:
        await self.execute("INSERT INTO schema_meta (key, value) VALUES ($1, $2) "
                           "ON CONFLICT (key) DO UPDATE SET value = excluded.value", key, value)

    async def add_schema_version(self, version: int) -> None:
        now = "0" if self.backend == "sqlite" else "now()"
        await self.execute(f"INSERT INTO schema_version (version, applied_at) "
                           f"VALUES ({version}, {now})")

    async def meta(self) -> dict[str, str]:
        return {k: v for k, v in await self.execute("SELECT key, value FROM schema_meta")}

    async def snapshot(self) -> tuple[object, ...]:
        """Everything a gateway's open could write: schema rows, meta, instances, jobs."""
        return tuple([await self.execute(sql) for sql in (
            "SELECT version FROM schema_version ORDER BY version",
            "SELECT key, value FROM schema_meta ORDER BY key",
            "SELECT instance_id FROM gateway_instances ORDER BY instance_id",
            "SELECT id, status FROM jobs ORDER BY id")])


@pytest.fixture(params=["sqlite", "postgres"])
async def raw(request: pytest.FixtureRequest, tmp_path: Path,
              anyio_backend: str) -> AsyncIterator[RawStore]:
    if request.param == "sqlite":
        raw = RawStore("sqlite", str(tmp_path / "state" / "jobs.db"))
    else:
        raw = RawStore("postgres", request.getfixturevalue("postgres_dsn"))
    first = raw.gateway_store()
    await first.open()  # the store as this release migrates it
    await first.insert_job(NewJob(id="before", provider="claude", request_key="k",
                                         owner_instance="old"), TTL_S)
    await first.close()
    yield raw


async def test_a_migrated_store_records_its_lowest_writer_and_who_migrated_it(
    raw: RawStore,
) -> None:
    assert await raw.meta() == {compat.META_MIN_WRITER: compat.min_writer_for(SCHEMA_VERSION),
                                compat.META_MIGRATED_BY: __version__}
    assert compat.min_writer_for(SCHEMA_VERSION) == "0.2.0"
    # Reopening migrates nothing and rewrites nothing.
    store = raw.gateway_store()
    await store.open()
    await store.close()
    assert await raw.meta() == {compat.META_MIN_WRITER: "0.2.0",
                                compat.META_MIGRATED_BY: __version__}


async def test_a_gateway_older_than_the_lowest_writer_refuses_before_writing_anything(
    raw: RawStore,
) -> None:
    # A later release migrated the store and declared that this one may no longer write it.
    await raw.add_schema_version(SCHEMA_VERSION + 1)
    await raw.set_meta(compat.META_MIN_WRITER, "99.1.0")
    await raw.set_meta(compat.META_MIGRATED_BY, "99.1.2")
    before = await raw.snapshot()
    store = raw.gateway_store()
    with pytest.raises(StoreUnavailable) as refused:
        await store.open()
    assert refused.value.permanent
    message = str(refused.value)
    assert f"migrated by agent-cli-gateway 99.1.2 (schema {SCHEMA_VERSION + 1})" in message
    assert f"this is agent-cli-gateway {__version__} (schema {SCHEMA_VERSION})" in message
    assert message.endswith("upgrade agent-cli-gateway to >= 99.1.0")
    assert await raw.snapshot() == before  # nothing written: no migration, no meta, no row


async def test_a_lowest_writer_above_this_gateway_refuses_even_on_a_schema_it_knows(
    raw: RawStore,
) -> None:
    await raw.set_meta(compat.META_MIN_WRITER, "99.0.0")
    before = await raw.snapshot()
    with pytest.raises(StoreUnavailable, match=r"upgrade agent-cli-gateway to >= 99\.0\.0"):
        await raw.gateway_store().open()
    assert await raw.snapshot() == before


async def test_a_newer_schema_with_no_writer_rule_is_refused_the_same_way(
    raw: RawStore,
) -> None:
    # What a gateway that recorded no rule (or 0.1.0's view of any newer schema) leaves.
    await raw.add_schema_version(SCHEMA_VERSION + 1)
    await raw.execute("DELETE FROM schema_meta")
    before = await raw.snapshot()
    with pytest.raises(StoreUnavailable) as refused:
        await raw.gateway_store().open()
    assert refused.value.permanent
    assert (f"a release that knows schema {SCHEMA_VERSION + 1}" in str(refused.value)
            and "upgrade agent-cli-gateway to >=" in str(refused.value))
    assert await raw.snapshot() == before


async def test_a_gateway_the_newer_schema_still_allows_keeps_serving(raw: RawStore) -> None:
    # A later additive migration kept this release as its lowest writer.
    await raw.add_schema_version(SCHEMA_VERSION + 1)
    await raw.set_meta(compat.META_MIGRATED_BY, "99.0.0")
    store = raw.gateway_store()
    await store.open()
    try:
        assert await store.schema_version() == SCHEMA_VERSION + 1  # never "migrated" down
        await store.insert_job(NewJob(id="after", provider="claude", request_key="k2",
                                       owner_instance="new"), TTL_S)
        row = await store.get_job("before")
        assert row is not None and row.id == "before"
    finally:
        await store.close()
    assert (await raw.meta())[compat.META_MIGRATED_BY] == "99.0.0"  # not rewritten


def test_versions_compare_as_numbers_and_a_pre_release_counts_as_its_release() -> None:
    assert compat.version_key("0.10.1") > compat.version_key("0.9.3")
    assert compat.version_key("0.3.0rc1") == compat.version_key("0.3.0")
    assert compat.version_key("1.0") < compat.version_key("1.0.1")
    assert compat.refusal("s", SCHEMA_VERSION, {compat.META_MIN_WRITER: "0.2.0"},
                          gateway_version="0.2.0") is None
    assert compat.refusal("s", SCHEMA_VERSION, {compat.META_MIN_WRITER: "0.2.1"},
                          gateway_version="0.2.0") is not None
    # A lowest writer never goes down when an older rule is applied again.
    assert compat.meta_rows([7], {compat.META_MIN_WRITER: "0.5.0"}, "0.5.0") == {
        compat.META_MIGRATED_BY: "0.5.0"}
    assert compat.meta_rows([], {}) == {}


async def test_the_heartbeat_writes_the_worst_renewal_wait_and_the_instances_show_it(
    store: JobStore,
) -> None:
    """On every backend of the contract matrix (the `store` fixture)."""
    await store.register_instance(InstanceRow(
        instance_id="i", hostname="h", boot_id="b", pid=1, pid_started_at=None, role="stdio",
        version=__version__), TTL_S)
    (row,) = await store.list_instances()
    assert row.renewal_wait_ms_max_1h is None  # none measured yet
    assert await store.heartbeat("i", TTL_S, renewal_wait_ms=812.5) == 1
    (row,) = await store.list_instances()
    assert row.renewal_wait_ms_max_1h == 812.5
    # A heartbeat that measured nothing new keeps the last value; a re-registration too.
    assert await store.heartbeat("i", TTL_S) == 1
    await store.register_instance(InstanceRow(
        instance_id="i", hostname="h", boot_id="b", pid=1, pid_started_at=None, role="stdio",
        version=__version__), TTL_S)
    (row,) = await store.list_instances()
    assert row.renewal_wait_ms_max_1h == 812.5
