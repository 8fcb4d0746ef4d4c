"""The store itself (the StoreMeta role) and the conformance of every backend to every role
of the JobStore protocol (gateway/store/base.py), on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import anyio
import pytest

from gateway.store.base import SCHEMA_VERSION, JobStore

pytestmark = pytest.mark.anyio


# -- the protocol itself ------------------------------------------------------------------

# The roles JobStore is composed of (gateway/store/base.py and protocol_roles.py), each a
# protocol of its own.
ROLES = tuple(base for base in JobStore.__bases__
              if base.__module__ in {"gateway.store.base", "gateway.store.protocol_roles"})


def methods_of(role: type) -> list[str]:
    return sorted(name for name, member in vars(role).items()
                  if inspect.iscoroutinefunction(member))


def test_the_store_protocol_is_its_roles_and_each_method_has_one_role() -> None:
    assert [role.__name__ for role in ROLES] == [
        "StoreMeta", "InstanceRows", "JobRows", "UsageLedger", "SweepClaims", "WorkerQueue",
        "AttemptGroups", "NoticeOutbox"]
    methods = [name for role in ROLES for name in methods_of(role)]
    assert len(methods) == len(set(methods)), "a method declared by two roles"
    assert not methods_of(JobStore), "JobStore declares nothing of its own: give it a role"


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.__name__)
async def test_backend_implements_every_method_of_each_role_with_its_signature(
    store: JobStore, store_target: object, role: type
) -> None:
    assert isinstance(store, role)
    assert store.backend == store_target.backend  # type: ignore[attr-defined]
    for name in methods_of(role):
        implementation = getattr(type(store), name, None)
        assert implementation is not None, f"{store.backend} lacks {role.__name__}.{name}"
        assert inspect.iscoroutinefunction(implementation), f"{name} must be async"
        wanted = list(inspect.signature(getattr(role, name)).parameters)
        assert list(inspect.signature(implementation).parameters) == wanted, name


async def test_open_store_migrates_to_the_current_schema_version(store: JobStore) -> None:
    assert await store.schema_version() == SCHEMA_VERSION


async def test_ten_stores_opening_fresh_storage_at_once_all_migrate_it_and_reopening_is_a_no_op(
        store_factory: Callable[[], Awaitable[JobStore]]) -> None:
    """Concurrent first opens (ten windows starting together) must all succeed: SQLite
    serializes them with BEGIN IMMEDIATE, PostgreSQL with an advisory lock; without it,
    concurrent CREATE TABLE IF NOT EXISTS races on the catalog and two openers insert the
    same schema_version row. A late opener then finds nothing to do."""
    opened: list[JobStore] = []

    async def open_one() -> None:
        opened.append(await store_factory())

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(open_one)
    late = await store_factory()
    for store in [*opened, late]:
        assert await store.schema_version() == SCHEMA_VERSION


async def test_store_clock_is_epoch_seconds_close_to_this_host(store: JobStore) -> None:
    # Same host in tests: the database clock and ours agree to within a few seconds.
    assert abs(await store.now() - datetime.now(UTC).timestamp()) < 5
