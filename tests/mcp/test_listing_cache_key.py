"""The key and the file of the cached first listing (gateway/mcp/listing_cache.py), and the
private atomic write it uses (gateway/fs.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from mcp.types import Tool as MCPTool

from gateway.config import Settings, load_settings
from gateway.fs import write_private_atomically
from gateway.mcp.listing_cache import listing_key, read_listing, write_listing
from tests.conftest import clean_home

TOOLS = [MCPTool(name="noop", description="does nothing", input_schema={"type": "object"})]


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    clean_home(tmp_path, monkeypatch)

    def build(**sections: Any) -> Settings:
        return load_settings(persistence={"backend": "memory"}, **sections)

    return build


def test_the_key_follows_what_shapes_the_tool_text_and_never_a_secret(settings: Any) -> None:
    base = listing_key(settings(), ("claude",), None)
    assert listing_key(settings(), ("claude",), None) == base
    assert listing_key(settings(), ("claude", "codex"), None) != base
    assert listing_key(settings(), ("claude",), "broken config") != base
    assert listing_key(settings(limits={"sync_defer_after_s": 7}), ("claude",), None) != base
    # A token is not part of any tool's text: changing it changes nothing (and is not hashed).
    assert listing_key(settings(http={"auth_token": "a" * 32}), ("claude",), None) == \
        listing_key(settings(http={"auth_token": "b" * 32}), ("claude",), None)


def test_a_listing_is_read_back_only_under_its_own_key(tmp_path: Path) -> None:
    path = tmp_path / "state" / "tool-listing.json"
    assert read_listing(path, "k1") is None  # no file yet
    write_listing(path, "k1", TOOLS)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_listing(path, "k1") == TOOLS
    assert read_listing(path, "k2") is None
    for damaged in (b"", b"[1, 2]", b'{"key": "k1"}', b'{"key": "k1", "tools": [{"x": 1}]}'):
        path.write_bytes(damaged)
        assert read_listing(path, "k1") is None, damaged


def test_a_private_atomic_write_replaces_the_file_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    path = tmp_path / "made" / "file.json"
    write_private_atomically(path, b"one")
    # A crashed writer's leftover with a loose mode is rewritten private.
    leftover = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    leftover.write_bytes(b"junk")
    leftover.chmod(0o666)
    write_private_atomically(path, b"two")
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.json"]


def test_a_listing_another_user_could_have_written_is_never_read_nor_written_there(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = state / "tool-listing.json"
    write_listing(path, "k1", TOOLS)
    path.chmod(0o644)  # readable by others: not the private file the gateway writes
    assert read_listing(path, "k1") is None
    path.chmod(0o600)
    elsewhere = tmp_path / "elsewhere.json"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)  # a link at the name is not followed
    assert read_listing(path, "k1") is None
    path.unlink()
    elsewhere.rename(path)
    state.chmod(0o777)  # a state dir every user can write: the gateway would not start on it
    assert read_listing(path, "k1") is None
    path.unlink()
    write_listing(path, "k1", TOOLS)
    assert not path.exists()
    state.chmod(0o700)
    assert read_listing(path, "k1") is None  # nothing was written into the shared dir
