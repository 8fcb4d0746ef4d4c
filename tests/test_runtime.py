"""The Gateway's background start: a stdio server defers it until the client's handshake is
answered, anyone who needs the job manager hurries it, and `defer_s` bounds it for a client
that does neither (startup stays fast). Real SQLite files; the store file appearing is the
sign that the start ran."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from gateway.config import Settings, load_settings
from gateway.model import ErrorKind, GatewayError
from gateway.runtime import Gateway
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

NEVER_S = 3600.0  # a deferral that outlasts the test: only a trigger can start the gateway
READY_BOUND_S = 20.0  # bound of every wait for a start (a loaded 2-core box)
SETTLE_S = 0.3  # how long a gateway that must not start is watched not starting


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "jobs.db"


@pytest.fixture
def settings(tmp_path: Path, db: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    return load_settings(persistence={"backend": "sqlite", "path": str(db)})


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[Gateway]:
    gateway = Gateway(settings)
    try:
        yield gateway
    finally:
        with anyio.fail_after(scaled(READY_BOUND_S)):
            await gateway.stop()


async def test_a_deferred_start_opens_nothing_until_start_soon(gateway: Gateway, db: Path) -> None:
    """Waiting for readiness (as the CLI version probe does) does not hurry it either."""
    gateway.start_in_background(defer_s=NEVER_S)
    assert await gateway.wait_ready(SETTLE_S) is False
    assert not db.exists() and gateway.current_manager is None
    gateway.start_soon()
    assert await gateway.wait_ready(READY_BOUND_S) is True
    assert db.exists() and gateway.current_manager is not None


async def test_start_soon_with_a_delay_starts_a_deferred_gateway(gateway: Gateway) -> None:
    gateway.start_in_background(defer_s=NEVER_S)
    gateway.start_soon(0.05)
    assert await gateway.wait_ready(READY_BOUND_S) is True


async def test_a_caller_of_manager_starts_a_deferred_gateway_at_once(gateway: Gateway) -> None:
    gateway.start_in_background(defer_s=NEVER_S)
    manager = await gateway.manager(READY_BOUND_S)
    assert manager is gateway.current_manager and gateway.ready


async def test_a_deferred_start_begins_by_itself_after_defer_s(gateway: Gateway) -> None:
    gateway.start_in_background(defer_s=0.05)
    assert await gateway.wait_ready(READY_BOUND_S) is True


async def test_a_gateway_stopped_before_its_deferred_start_never_opens_the_store(
        settings: Settings, db: Path) -> None:
    gateway = Gateway(settings)
    gateway.start_in_background(defer_s=NEVER_S)
    await anyio.sleep(0)
    with anyio.fail_after(scaled(READY_BOUND_S)):
        await gateway.stop()
    assert not db.exists() and not gateway.ready


@pytest.mark.parametrize("flaw", ["writable by others", "owned by another user"])
@pytest.mark.parametrize("which", ["state", "spool"])
async def test_a_state_or_spool_dir_other_users_can_write_is_refused_with_setup_error(
    settings: Settings, gateway: Gateway, db: Path, flaw: str, which: str
) -> None:
    # Issue 23, item 2: the gateway only warned, and another user planted a forged spool in
    # such a dir that the next gateway adopted. Now it does not start at all.
    directory = settings.state_dir if which == "state" else settings.state_dir / "spool"
    directory.mkdir(parents=True, mode=0o700)
    if flaw == "writable by others":
        directory.chmod(0o777)
    elif os.geteuid() == 0:
        os.chown(directory, 65534, 65534)
    else:
        pytest.skip("only root can give a directory to another user")
    gateway.start_in_background(defer_s=0)
    with pytest.raises(GatewayError) as refused, anyio.fail_after(scaled(READY_BOUND_S)):
        await gateway.manager(wait_s=READY_BOUND_S)
    assert refused.value.kind is ErrorKind.SETUP_ERROR
    assert str(directory) in refused.value.message
    assert ("writable by other users" if flaw == "writable by others"
            else "owned by uid 65534") in refused.value.message
    assert not db.exists()  # no store was opened
