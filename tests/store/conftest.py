"""The store contract matrix: every test that takes `store` runs on memory, SQLite and
PostgreSQL. `second_store` is a second, independent connection to the SAME storage (same
SQLite file, same PostgreSQL database; for memory, the same object), for race tests.

Stores are built through the real factory, `gateway.store.open_store(settings)`, so the
factory is exercised by every contract test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from gateway.config import Settings, load_settings
from gateway.store import open_store
from gateway.store.base import JobStore

# "pgbouncer": the PostgreSQL store through PgBouncer in transaction pooling mode
# (`pooler = "pgbouncer"`): the same contract with no session state.
BACKENDS = ("memory", "sqlite", "postgres", "pgbouncer")


class StoreTarget:
    """One storage (a file, a database, a memory object) that tests can open repeatedly."""

    def __init__(self, backend: str, settings: Settings) -> None:
        self.backend = backend
        self.settings = settings
        self._opened: list[JobStore] = []
        self._memory: JobStore | None = None

    async def open(self) -> JobStore:
        """A new connection to the same storage (memory: the one shared object)."""
        if self.backend == "memory":
            if self._memory is None:
                self._memory = await open_store(self.settings)
                self._opened.append(self._memory)
            return self._memory
        store = await open_store(self.settings)
        self._opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in reversed(self._opened):
            await store.close()
        self._opened.clear()


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    backend: str = request.param
    config = tmp_path / "config.toml"
    config.write_text("")  # explicit, empty: never read the real ~/.agent-cli-gateway
    persistence: dict[str, object] = {"backend": backend}
    if backend == "sqlite":
        persistence["path"] = str(tmp_path / "state" / "jobs.db")
    elif backend == "postgres":
        persistence["dsn"] = request.getfixturevalue("postgres_dsn")
    elif backend == "pgbouncer":
        persistence.update(backend="postgres", pooler="pgbouncer",
                           dsn=request.getfixturevalue("pgbouncer_dsn"))
        backend = "postgres"
    return StoreTarget(backend, load_settings(config, persistence=persistence))


@pytest.fixture
async def store_factory(
    store_target: StoreTarget, anyio_backend: str
) -> AsyncIterator[Callable[[], Awaitable[JobStore]]]:
    """Opens further connections to the test's storage; closes them all afterwards."""
    try:
        yield store_target.open
    finally:
        with anyio.CancelScope(shield=True):
            await store_target.close_all()


@pytest.fixture
async def store(store_factory: Callable[[], Awaitable[JobStore]]) -> JobStore:
    return await store_factory()


@pytest.fixture
async def second_store(
    store: JobStore, store_factory: Callable[[], Awaitable[JobStore]]
) -> JobStore:
    return await store_factory()

