"""#38 item 7: the state dir is never reached through another user's link, and what the
gateway makes there is never a link.

As root (like the gateway of a user whose /tmp another user shares), a symlink owned by
nobody (uid 65534) is planted in a sticky 1777 dir and the state dir is pointed through it:
a real `python -m gateway` behind the SDK's stdio client refuses with `setup_error` saying
what to do, and nothing appears at the link's target. The kernel's `protected_symlinks` is
off in most containers and says nothing the gateway can show, so the gateway checks by
itself. A link of the gateway's own user (or of the dir's owner) is followed as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import tomli_w
from mcp import Client

from gateway.fs import ensure_private_dir, foreign_link_problem
from tests.mcp.conftest import stdio_client
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

NOBODY = 65534
STICKY_SHARED = 0o1777  # /tmp's mode
SESSION_BOUND_S = 60.0  # a cold `python -m gateway` on a loaded 2-core box, and one call

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="only root can give a symlink to another user")


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Path:
    """A directory like /tmp: every user may add names, each removes only their own."""
    directory = tmp_path / "shared-tmp"
    directory.mkdir()
    directory.chmod(STICKY_SHARED)
    return directory


def plant(link: Path, target: Path, uid: int) -> Path:
    """A symlink at `link` to `target`, owned by `uid` (not following it)."""
    link.symlink_to(target)
    os.lchown(link, uid, uid)
    return link


def config_with_store(tmp_path: Path, db: Path) -> Path:
    config = tmp_path / "config.toml"
    config.write_bytes(tomli_w.dumps({
        "persistence": {"backend": "sqlite", "path": str(db)},
        "logging": {"level": "info", "format": "json"}}).encode())
    return config


async def first_calls(tmp_path: Path, config: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """gateway_status and llm_job_list of a fresh stdio gateway: its structured answers."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    with anyio.fail_after(scaled(SESSION_BOUND_S)):
        async with stdio_client(home, config, "auto") as client:
            return (await data_of(client, "gateway_status"),
                    await data_of(client, "llm_job_list"))


async def data_of(client: Client, tool: str) -> dict[str, Any]:
    answer = await client.call_tool(tool, {})
    data: dict[str, Any] | None = answer.structured_content
    assert data is not None, answer
    return data


def target_empty_dir(tmp_path: Path) -> Path:
    target = tmp_path / "mine" / "victim"
    target.mkdir(parents=True, mode=0o700)
    return target


def target_not_made(tmp_path: Path) -> Path:
    (tmp_path / "mine").mkdir(mode=0o700)
    return tmp_path / "mine" / "not-made-yet"


@needs_root
@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("make_target", [target_empty_dir, target_not_made],
                         ids=["an empty dir of ours", "a path not made yet"])
async def test_a_state_dir_through_another_users_link_in_a_sticky_dir_is_refused(
    tmp_path: Path, shared_tmp: Path, make_target: Callable[[Path], Path],
) -> None:
    # Before #38 the checks stat()ed through the link: the target was ours and 0700, so the
    # gateway kept its jobs wherever the other user's link pointed.
    target = make_target(tmp_path)
    link = plant(shared_tmp / "agent-gateway", target, NOBODY)
    status, listed = await first_calls(tmp_path, config_with_store(tmp_path, link / "jobs.db"))

    assert status["ready"] is False and status["problem_permanent"] is True
    problem = status["problem"]
    assert f"passes {link}, a symlink owned by uid {NOBODY}" in problem, problem
    assert "every user can write" in problem and "[persistence] path" in problem
    assert listed["error_kind"] == "setup_error" and str(link) in listed["error"]
    if target.exists():
        assert list(target.iterdir()) == []
    else:
        assert not os.path.lexists(target)


@pytest.mark.slow  # starts a process
@needs_root
async def test_a_link_of_the_gateways_own_user_in_a_sticky_dir_is_followed(
    tmp_path: Path, shared_tmp: Path,
) -> None:
    target = target_empty_dir(tmp_path)
    link = plant(shared_tmp / "agent-gateway", target, os.geteuid())
    status, listed = await first_calls(tmp_path, config_with_store(tmp_path, link / "jobs.db"))
    assert status["ready"] is True, status["problem"]
    assert listed["jobs"] == [] and (target / "jobs.db").is_file()


@needs_root
def test_the_links_of_a_path_are_followed_as_the_kernel_would(
    tmp_path: Path, shared_tmp: Path,
) -> None:
    ours = target_empty_dir(tmp_path)
    (tmp_path / "lane").mkdir(mode=0o700)
    # The sticky dir's owner may link in it (the kernel allows it too).
    os.chown(shared_tmp, NOBODY, NOBODY)
    owners = plant(shared_tmp / "owners", ours, NOBODY)
    assert foreign_link_problem(owners / "state") is None
    os.chown(shared_tmp, 0, 0)
    # A chain: our own link, relative, to another user's link in the sticky dir.
    planted = plant(shared_tmp / "planted", ours, NOBODY)
    chain = plant(tmp_path / "lane" / "chain", Path("..") / "shared-tmp" / "planted",
                  os.geteuid())
    problem = foreign_link_problem(chain / "state" / "spool")
    assert problem is not None and f"passes {planted}" in problem
    # A dir other users cannot write holds no planted link, whoever owns the link in it.
    elsewhere = plant(tmp_path / "lane" / "elsewhere", ours, NOBODY)
    assert foreign_link_problem(elsewhere / "state") is None
    # Nothing on the way exists yet, or no link at all.
    assert foreign_link_problem(tmp_path / "nothing" / "here") is None
    assert foreign_link_problem(ours) is None


def test_a_link_where_the_gateway_makes_a_directory_is_never_followed(tmp_path: Path) -> None:
    # A dangling link looks missing to exists(): mkdir then failed with EEXIST, and the
    # chmod that followed went to the link's target.
    target = tmp_path / "target"
    (tmp_path / "state").symlink_to(target)
    with pytest.raises(OSError, match="symlink where the gateway makes a directory"):
        ensure_private_dir(tmp_path / "state" / "spool")
    assert not os.path.lexists(target)
    made = tmp_path / "made" / "deep"
    ensure_private_dir(made)
    assert (made.stat().st_mode & 0o777, made.parent.stat().st_mode & 0o777) == (0o700, 0o700)
