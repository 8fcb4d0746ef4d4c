"""The platform facts in one home: what differs by OS behind one small interface.

Two implementations define the same names (`Platform` below says what each means):
- `linux` (linux.py): procfs and process file descriptors, what Linux runs;
- `portable` (portable.py): POSIX without either (psutil, kqueue where it exists, a bounded
  poll elsewhere), what macOS and the BSDs run.

`AGENT_GATEWAY_PLATFORM=auto|linux|portable` chooses (auto: `linux` on Linux, `portable` on
every other POSIX system), so CI runs the lifecycle tests under both on Linux. A system
without the POSIX process model (native Windows) gets `unsupported`: the gateway still
answers the MCP handshake there, and every tool says how to run it through WSL
(`setup_problem`, served by gateway/mcp/serve.py). Naming `unsupported` forces that verdict.

This is the only module that looks at the OS; no other module names procfs, a process fd or an
OS. The implementations are stdlib only (portable.py: and psutil) and import nothing of the
gateway, because a run's supervisor imports them as top-level modules from this folder.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

ENV_VAR = "AGENT_GATEWAY_PLATFORM"
AUTO = "auto"
LINUX = "linux"
PORTABLE = "portable"
UNSUPPORTED = "unsupported"
IMPLEMENTATIONS = (LINUX, PORTABLE)
CHOICES = (AUTO, *IMPLEMENTATIONS, UNSUPPORTED)
PLATFORM_DIR = Path(__file__).resolve().parent


class ExitWatch(Protocol):
    """A descriptor that turns readable once one process has exited (select()able)."""

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Platform(Protocol):
    """What both implementation modules define (mypy checks each module against it)."""

    NAME: str
    NON_DUMPABLE: str  # what make_non_dumpable() does here, or what it cannot
    MAX_NICE: int

    def boot_id(self) -> str:
        """An id of the current boot (a pid and start time identify a process within one)."""
        ...

    def process_state(self, pid: int) -> tuple[float, bool] | None:
        """(start time in epoch seconds, is a zombie), or None when there is no such process."""
        ...

    def own_start_time(self) -> float | None:
        """This process's start time exactly as process_state gives it to another process."""
        ...

    def group_members(self, pgid: int, exclude: int | None = None) -> list[int]:
        """Live (non-zombie) members of process group `pgid`, except pid `exclude`."""
        ...

    def exit_watch(self, pid: int) -> ExitWatch | None:
        """A handle readable once child `pid` exited, or None (then the caller polls)."""
        ...

    def autogroup_nice(self, pid: int) -> int | None:
        """The nice value of `pid`'s scheduling autogroup, None where there is none."""
        ...

    def set_autogroup_nice(self, pid: int, value: int) -> bool:
        """Set it (pid 0: this process); False only when worth retrying later."""
        ...

    def make_non_dumpable(self) -> bool:
        """Keep processes of the same user from reading this one's memory and environment."""
        ...

    def make_dumpable(self) -> bool:
        """Undo make_non_dumpable (for a process forked from a non-dumpable one that must
        first set its own autogroup's nice value)."""
        ...

    def detach_kwargs(self) -> dict[str, Any]:
        """subprocess.Popen arguments that start a process detached from this one: in a
        session and process group of its own whose id is its pid (what a run's pgid is)."""
        ...

    def fork_detached(self) -> bool:
        """Fork a child that leaves this session at once: True in it (it must end with
        os._exit), False in this process once the child has left our process group.
        Raises OSError when the fork fails."""
        ...


if TYPE_CHECKING:  # mypy checks that each implementation module has the whole interface
    from gateway.platform import linux as _linux
    from gateway.platform import portable as _portable

    _IMPLEMENTED: tuple[Platform, Platform] = (_linux, _portable)


class UnknownPlatform(ValueError):
    """AGENT_GATEWAY_PLATFORM names no implementation."""


def _auto() -> str:
    if sys.platform.startswith("linux"):
        return LINUX
    if os.name == "posix" and hasattr(os, "setsid") and hasattr(os, "killpg"):
        return PORTABLE
    return UNSUPPORTED


def choose(value: str | None = None) -> str:
    """The implementation to use: `value`, else $AGENT_GATEWAY_PLATFORM, `auto` resolved.

    Returns LINUX, PORTABLE or UNSUPPORTED (no POSIX process model: native Windows, or
    forced). Raises UnknownPlatform for any other value. `linux` forced where procfs is
    missing is refused the same way (UNSUPPORTED would hide the mistake).
    """
    raw = (os.environ.get(ENV_VAR, "") if value is None else value).strip().lower() or AUTO
    if raw not in CHOICES:
        raise UnknownPlatform(  # never the value: a pasted secret would be echoed (#38)
            f"{ENV_VAR} is not one of {', '.join(CHOICES)} (its value is never shown); "
            f"unset it (auto) or name one of them.")
    if raw == AUTO:
        return _auto()
    if raw != UNSUPPORTED and _auto() == UNSUPPORTED:
        return UNSUPPORTED  # forcing an implementation cannot give this OS a process model
    if raw == LINUX and not sys.platform.startswith("linux"):
        raise UnknownPlatform(f"{ENV_VAR}=linux needs Linux (procfs, process fds); this is "
                              f"{sys.platform}: use portable or auto.")
    return raw


def load(name: str) -> Platform:
    """The implementation module `name` (LINUX or PORTABLE)."""
    if name not in IMPLEMENTATIONS:
        raise UnknownPlatform(f"no platform implementation named {name!r}")
    module: Platform = import_module(f"{__name__}.{name}")
    return module


def current() -> Platform:
    """The implementation this process uses (read from the environment each time: cheap,
    and a test may force another one between two gateways). Raises UnknownPlatform, and
    on an unsupported system too: nothing there may run a process of ours."""
    name = choose()
    if name == UNSUPPORTED:
        raise UnknownPlatform(f"this system ({sys.platform}) lacks the POSIX process model "
                              f"the gateway runs providers with")
    return load(name)


# The Claude Desktop entry that runs the gateway inside WSL (the user's default distribution),
# the supported way on Windows: from a checkout cloned inside WSL, the form that works before a
# release is on PyPI (README.md shows the same snippet; WSL_RELEASE_ARGS once released).
WSL_CHECKOUT = "/home/you/agent-cli-gateway"
WSL_SNIPPET = ('{"mcpServers": {"agent-cli-gateway": {"command": "wsl.exe", '
               f'"args": ["uv", "run", "--directory", "{WSL_CHECKOUT}", "agent-cli-gateway"]}}}}}}')
WSL_RELEASE_ARGS = '["uvx", "agent-cli-gateway"]'


def unsupported_message() -> str:
    """What every tool answers (setup_error) where the POSIX process model is missing."""
    return (f"agent-cli-gateway cannot run provider CLIs natively on this system "
            f"({sys.platform}): it needs POSIX process groups and signals. Run it inside WSL "
            f"instead: install uv in your WSL distribution and clone agent-cli-gateway there, "
            f"then in Claude Desktop's claude_desktop_config.json use {WSL_SNIPPET} (your "
            f"clone's path inside WSL for {WSL_CHECKOUT}; for Codex on Windows: command = "
            f"\"wsl.exe\" with the same args; once a release is on PyPI, args = "
            f"{WSL_RELEASE_ARGS}), and restart the client. This will not pass by itself.")


def setup_problem() -> str | None:
    """Why the gateway cannot run here (an unknown AGENT_GATEWAY_PLATFORM, or no POSIX
    process model), or None. Checked before serving: the server then still completes the
    MCP handshake and every tool answers this as setup_error."""
    try:
        name = choose()
    except UnknownPlatform as exc:
        return f"The gateway cannot start: {exc}"
    return unsupported_message() if name == UNSUPPORTED else None


def logins_in_keychain() -> bool:
    """Whether provider CLIs here keep their login in the OS keychain (macOS), where no file
    shows it from outside (`doctor` then cannot tell whether claude is logged in)."""
    return sys.platform == "darwin"


def describe() -> dict[str, str]:
    """What gateway_status and `doctor --json` report: {"implementation", "os"}."""
    try:
        implementation = choose()
    except UnknownPlatform:
        implementation = "invalid"
    return {"implementation": implementation, "os": sys.platform}


def supervisor_paths(name: str) -> list[str]:
    """The directories a run's supervisor (`python -I -S`: no site-packages) appends to
    sys.path to import implementation `name`: this folder, and for `portable` the one psutil
    was imported from. Appended after the stdlib, so nothing there can shadow it."""
    paths = [str(PLATFORM_DIR)]
    if name == PORTABLE:
        import psutil  # deferred: start-up (psutil: only a portable run's spec needs its folder)

        paths.append(str(Path(psutil.__file__).resolve().parent.parent))
    return paths


def supervisor_spec() -> dict[str, Any]:
    """The fields of a run's spec (run.json) that tell its supervisor which implementation
    to use: the gateway's own, so both read the same start times and boot."""
    name = current().NAME
    return {"platform": name, "platform_path": supervisor_paths(name)}
