"""Which provider tools `tools/list` offers: the ones that can work on this machine.

Every listed tool's name, description and schema go into the calling model's context on
every turn, so a provider whose CLI is not installed is not listed (14 tools that could only
answer `not_found` cost about 40 KB). The set follows the machine: it is re-checked on a
cheap timer (a PATH scan, stat calls only) and on `gateway_status`, and each change is
announced with `notifications/tools/list_changed` (to legacy sessions directly, to
2026-07-28 clients through their `subscriptions/listen` streams). A call to an unlisted
provider's tool still gets an answer: `not_found`, saying where the gateway looked and how
to install the CLI.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import TYPE_CHECKING, Any

import structlog
from mcp.server.mcpserver.tools import Tool
from mcp.shared.subscriptions import ToolsListChanged
from mcp.types import CallToolResult
from mcp.types import Tool as MCPTool

from gateway.config import Settings
from gateway.mcp.listing_cache import cache_path, listing_key, read_listing, write_listing
from gateway.mcp.results import failure
from gateway.model import ErrorKind
from providers.registry import CLI_PROVIDERS, missing_command, provider_binary

if TYPE_CHECKING:
    from mcp.server.session import ServerSession
    from mcp.server.subscriptions import SubscriptionBus

    from gateway.mcp.server_state import ServerState

log = structlog.get_logger(__name__)

RECHECK_S = 10.0  # a CLI installed while the gateway runs is listed within this long
REQUEST_SUFFIXES = ("_request_async", "_request")  # longest first


def listed_providers(settings: Settings,
                     on_workers: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The providers whose tools are listed: enabled CLI providers whose binary is found
    (PATH plus the user bin dirs), then the enabled ones only a live worker has
    (`on_workers`: their runs_on defaults to "any"), then every configured HTTP API
    provider."""
    search = os.environ.get("PATH", "")
    enabled = [name for name, config in settings.providers.items()
               if name in CLI_PROVIDERS and config.enabled]
    found = [name for name in enabled
             if provider_binary(name, settings.providers[name].command, search) is not None]
    remote = [name for name in enabled if name in on_workers and name not in found]
    return (*found, *remote, *settings.api_providers)


def provider_of(tool_name: str) -> str | None:
    """`claude` for `claude_request` and `claude_request_async`, else None."""
    for suffix in REQUEST_SUFFIXES:
        if tool_name.endswith(suffix) and len(tool_name) > len(suffix):
            return tool_name[: -len(suffix)]
    return None


def unlisted_answer(settings: Settings, provider: str) -> CallToolResult | None:
    """The answer for a CLI provider's tool that is not listed, or None if `provider` is no
    CLI provider at all (then the tool is simply unknown)."""
    config = settings.providers.get(provider)
    if provider not in CLI_PROVIDERS or config is None:
        return None
    if not config.enabled:
        return failure(ErrorKind.INVALID_INPUT,
                       f"The {provider} provider is disabled in the gateway config "
                       f"([providers.{provider}] enabled = false), so its tools are not "
                       f"listed. Enable it there, or use a listed provider's tool.")
    return failure(ErrorKind.NOT_FOUND,
                   missing_command(provider, config.command, os.environ.get("PATH", "")) +
                   " Its tools are listed once the CLI is found (the gateway re-checks every "
                   f"{RECHECK_S:g} s and on gateway_status).")


class ToolListing:
    """The listed tools of one server, kept in step with what is installed.

    Request tools are built on first need and kept, so a provider that comes and goes is
    derived once. `sessions` are the legacy sessions seen, to notify; a session that ends is
    dropped from the weak set by itself.
    """

    def __init__(self, state: ServerState, bus: SubscriptionBus) -> None:
        self.state = state
        self.bus = bus
        self.listed: tuple[str, ...] = ()
        # CLI providers only live workers have (refresh_workers): listed with runs_on "any".
        self.on_workers: frozenset[str] = frozenset()
        self._built: dict[tuple[str, bool], list[Tool]] = {}
        self._job_tools: list[Tool] = []
        self.sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()
        self._cache_key: str | None = None  # of the first listing (listing_cache.py)
        self._kept = False  # whether the cache file holds the first listing already

    def initial(self) -> list[Tool]:
        """The tools to list at startup, in order: provider tools, then the job tools."""
        # Loaded at the first request that needs a tool, not before the handshake.
        from gateway.mcp.tools import build_job_tools  # deferred: start-up

        self._job_tools = build_job_tools(self.state)
        self._initial_key()  # sets self.listed
        return self.tools_for(self.listed)

    def _initial_key(self) -> str:
        """The first listing's providers (set once, here) and its cache key."""
        if self._cache_key is None:
            # Listed with a broken setup too (every call then answers setup_error): a model
            # told to "use codex" must find codex_request, and its answer says what is wrong.
            self.listed = self.state.listed_providers = listed_providers(self.state.settings)
            self._cache_key = listing_key(self.state.settings, self.listed,
                                          self.state.setup_error)
        return self._cache_key

    def cached_initial(self) -> list[MCPTool] | None:
        """The first listing as the last start with the same key wrote it (listing_cache.py),
        or None: then `initial()` derives the tools and `keep_initial` writes it."""
        tools = read_listing(cache_path(self.state.settings), self._initial_key())
        self._kept = tools is not None
        return tools

    def keep_initial(self, tools: list[MCPTool]) -> None:
        """Keep the first listing for the next start, unless it came from there."""
        if not self._kept:
            write_listing(cache_path(self.state.settings), self._initial_key(), tools)
            self._kept = True

    async def refresh_workers(self) -> None:
        """Read which providers the live workers have (PostgreSQL: the instance rows);
        a store that cannot answer keeps the last answer."""
        gateway = self.state.gateway
        manager = gateway.current_manager if gateway is not None else None
        if manager is None or manager.store.backend != "postgres":
            return
        # The placement rule: only a worker that takes remote work counts.
        from gateway.jobs.placement import live_hosts  # deferred: start-up

        try:
            hosts = live_hosts(await manager.store.list_instances(), await manager.store.now())
        except Exception as exc:
            log.warning("worker capabilities unreadable", action="tools_recheck",
                        error=repr(exc))
            return
        self.on_workers = frozenset(name for host in hosts if host.accept_remote
                                    for name in host.providers)

    def managed(self, name: str) -> bool:
        """Whether this listing owns the tool (other tools on the server are left alone)."""
        return (any(t.name == name for t in self._job_tools)
                or any(t.name == name for tools in self._built.values() for t in tools))

    def tools_for(self, providers: tuple[str, ...]) -> list[Tool]:
        tools: list[Tool] = []
        search = os.environ.get("PATH", "")
        for name in providers:
            config = self.state.settings.providers.get(name)
            remote_only = (name in self.on_workers and config is not None
                           and provider_binary(name, config.command, search) is None)
            key = (name, remote_only)
            if key not in self._built:
                from gateway.mcp.tools import request_tools  # deferred: start-up (initial())

                self._built[key] = request_tools(self.state, name, remote_only)
            tools += self._built[key]
        return [*tools, *self._job_tools]

    def recheck(self) -> list[Tool] | None:
        """The new tool list if the set of listed providers changed, else None."""
        try:
            now = listed_providers(self.state.settings, self.on_workers)
        except Exception as exc:  # a racing filesystem: keep the list, try again later
            log.warning("tool listing re-check failed", action="tools_recheck", error=repr(exc))
            return None
        if now == self.listed:
            return None
        log.info("provider tools changed", action="tools_changed", listed=list(now),
                 added=sorted(set(now) - set(self.listed)),
                 removed=sorted(set(self.listed) - set(now)))
        self.listed = self.state.listed_providers = now
        return self.tools_for(now)

    async def announce(self) -> None:
        """`notifications/tools/list_changed` to every client that can receive it."""
        for session in list(self.sessions):
            with contextlib.suppress(Exception):  # a closed session: nobody to tell
                await session.send_tool_list_changed()
        with contextlib.suppress(Exception):
            await self.bus.publish(ToolsListChanged())

    def remember(self, ctx: Any) -> None:
        """Keep a request's session, to notify it of later changes."""
        session = getattr(ctx, "session", None)
        if session is not None:
            with contextlib.suppress(TypeError):
                self.sessions.add(session)
