"""The first `tools/list` of a start, answered from the last start's listing (issue 45).

Deriving the tools (an argument model and its JSON schema for each of up to 19 derivations)
is about 100 ms, a tenth of a start to the first `tools/list`, and it gives the same listing
every start until the code, the listed providers or the configuration change. So a start
whose key matches the listing the last start wrote answers from it, and derives the tools
after that answer (or at the first call that needs one, whichever comes first).

The key: the Python version; the size and mtime of every source file of this project's
packages (so an edited checkout misses without a version bump) and the mtime of the SDK's
and pydantic's package directories (an upgrade rewrites them); the listed providers; the
configuration without the values of secret keys; and the setup error, if any. Anything
else, a file that cannot be read or parsed included, is a miss: the tools are derived as
before and the file is written again (private, by a rename). Only the user's own private
file in a state dir the gateway would start on is read, and only such a dir is written. The
cache is never a source of truth for a call: every call runs on tools derived here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import mcp
import pydantic
import structlog
from mcp.types import Tool as MCPTool

from gateway.config import Settings
from gateway.config.errors import is_secret_path
from gateway.fs import foreign_link_problem, shared_dir_problem, write_private_atomically

log = structlog.get_logger(__name__)

CACHE_NAME = "tool-listing.json"
FORMAT = 1  # bump when the file's shape changes
OWN_PACKAGES = ("gateway", "providers", "neutral")


def cache_path(settings: Settings) -> Path:
    return settings.state_dir / CACHE_NAME


@functools.cache
def code_fingerprint() -> str:
    """What the derived tools depend on besides the configuration: this project's sources
    (each file's size and mtime; about 1 ms) and the installed SDK and pydantic."""
    digest = hashlib.sha256(sys.version.encode())
    root = Path(__file__).resolve().parents[2]
    for package in OWN_PACKAGES:
        for directory, dirs, files in sorted(os.walk(root / package)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    info = os.stat(os.path.join(directory, name))
                    digest.update(f"{directory}/{name}:{info.st_size}:{info.st_mtime_ns};"
                                  .encode())
    for library in (mcp, pydantic):
        info = os.stat(Path(library.__file__ or "").parent)
        digest.update(f"{library.__name__}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()


def _without_secrets(node: Any, parts: tuple[str, ...] = ()) -> Any:
    """The settings as plain data, every key that holds a secret (`is_secret_path`, the
    rule `config show` redacts by) left out: no secret is hashed into a file."""
    if isinstance(node, dict):
        return {key: _without_secrets(value, (*parts, str(key))) for key, value in node.items()
                if not is_secret_path((*parts, str(key)))}
    if isinstance(node, list):
        return [_without_secrets(value, parts) for value in node]
    return node


def listing_key(settings: Settings, listed: tuple[str, ...], setup_error: str | None) -> str:
    """The key a cached listing must carry to answer this start's first tools/list."""
    material = {"format": FORMAT, "code": code_fingerprint(), "listed": list(listed),
                "setup_error": setup_error,
                "settings": _without_secrets(settings.model_dump(mode="json"))}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()
                          ).hexdigest()


def _unsafe(directory: Path) -> str | None:
    """Why the cache must be neither read nor written in `directory`: the rule the
    gateway's start applies to its state dir (runtime.py), so a listing another user could
    plant (tool text goes into the model's context) is never served, and nothing is written
    where the gateway refuses to start."""
    return foreign_link_problem(directory) or shared_dir_problem(directory)


def read_listing(path: Path, key: str) -> list[MCPTool] | None:
    """The listing written under `key`, or None (no file, another key, unreadable, or not
    the user's own private file in a safe directory)."""
    try:
        if (problem := _unsafe(path.parent)) is not None:
            raise PermissionError(problem)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
                raise PermissionError(f"not a private file of uid {os.geteuid()}")
            data = json.loads(file.read())
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        return [MCPTool.model_validate(tool) for tool in data["tools"]]
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged file is a miss; the next listing rewrites it
        log.debug("tool listing cache unreadable", action="tool_listing_cache",
                  path=str(path), error=repr(exc))
        return None


def write_listing(path: Path, key: str, tools: list[MCPTool]) -> None:
    """Keep this start's listing for the next start (a failure is only logged)."""
    data = {"key": key, "tools": [tool.model_dump(mode="json", by_alias=True,
                                                  exclude_none=True) for tool in tools]}
    try:
        if (problem := _unsafe(path.parent)) is not None:
            raise PermissionError(problem)
        write_private_atomically(path, json.dumps(data, separators=(",", ":")).encode())
    except OSError as exc:
        log.debug("tool listing cache not written", action="tool_listing_cache",
                  path=str(path), error=repr(exc))
