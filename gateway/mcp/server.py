"""The MCP server object and its lifespan (`serve.py` serves it over stdio or HTTP).

Startup answers at once: the lifespan only *starts* the gateway (store, manager, leases)
in the background and tools await it, so `initialize` and `tools/list` never wait on a
database or a CLI. Shutdown (stdin EOF, SIGTERM, SIGINT) leaves through the lifespan, which
drains jobs and marks the instance stopped within `lease.drain_timeout_s`, well before an
MCP client's SIGKILL (2 s after SIGTERM). Nothing is ever written to stdout: it is the stdio
protocol channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from mcp.server.lowlevel import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool, ToolManager
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.types import SubscriptionsListenRequestParams
from mcp.types import Tool as MCPTool
from pydantic import ValidationError

from gateway import __version__
from gateway.config import PROVIDER_NAMES, Settings
from gateway.mcp.listing import (
    RECHECK_S,
    ToolListing,
    listed_providers,
    provider_of,
    unlisted_answer,
)
from gateway.mcp.results import failure, invalid_arguments
from gateway.mcp.sdk_fence import FencedMCPServer
from gateway.mcp.server_state import ServerState
from gateway.mcp.task_listen import TaskListenHandler
from gateway.mcp.task_state import TASK_TOOLS
from gateway.mcp.tasks import TasksExtension
from gateway.mcp.tasks_legacy import LegacyTasksMiddleware
from gateway.mcp.unicode_errors import unencodable_path
from gateway.model import ErrorKind
from gateway.versions import CliVersions

if TYPE_CHECKING:  # loaded by the lifespan, after the handshake: not before tools/list
    from gateway.jobs.claims import CapabilityReader
    from gateway.runtime import Gateway

log = structlog.get_logger(__name__)

SERVER_NAME = "agent-cli-gateway"
STOP_MARGIN_S = 1.0  # beyond the drain timeout: leases stop, instance row, store close
PROBE_STOP_S = 1.0  # a stopped version probe kills its child and returns at once
VERSION_PROBE_START_WAIT_S = 15.0  # probe CLI versions once the store is up (or after this)
# A stdio client lists the tools right after `initialize`; the job machinery loads once that
# answer is out (a few ms to write it), so it never delays the handshake.
START_AFTER_LISTING_S = 0.1
# A listing answered from the cache (listing_cache.py): the tools are derived this long
# after it (or at a call that comes sooner), before the gateway's own start.
BUILD_AFTER_CACHED_LISTING_S = 0.05
START_DEFER_MAX_S = 1.0  # a stdio client that never lists tools: start anyway after this
LIST_CHANGED = NotificationOptions(tools_changed=True)  # the provider tools follow the machine
USAGE = (
    "<provider>_request waits for the answer (or defers a long job), "
    "<provider>_request_async returns a job_id at once. Every result's `next` names the call "
    "to make next, with its arguments; `reuse` says when an answer was replayed from an "
    "earlier identical request. gateway_status shows what is installed and whether the "
    "gateway is ready."
)


def instructions_for(listed: tuple[str, ...], setup_error: str | None) -> str:
    """The server's `instructions`, from what is listed on this machine and whether the
    setup is broken: a model reads them before any tool, so they must not promise CLIs
    that are not installed, nor hide that every call will fail."""
    clis = [name for name in listed if name in PROVIDER_NAMES]
    apis = [name for name in listed if name not in PROVIDER_NAMES]
    if clis or apis:
        what = " and ".join(part for part in (
            f"the coding-agent CLIs installed here ({', '.join(clis)})" if clis else "",
            f"the configured model APIs ({', '.join(apis)})" if apis else "") if part)
        text = f"Runs {what} as durable jobs: {USAGE}"
    else:
        text = (f"No coding-agent CLI is installed here yet (supported: "
                f"{', '.join(PROVIDER_NAMES)}), so only the job tools are listed; a CLI "
                f"installed later is listed within {RECHECK_S:g} s. {USAGE}")
    if setup_error is not None:
        text = (f"THE GATEWAY'S SETUP IS BROKEN: every tool except gateway_status answers "
                f"error_kind setup_error until the user fixes it and restarts the gateway; "
                f"retrying does not help, tell the user. The problem: {setup_error} {text}")
    return text


# Handlers the SDK registers that this server does not serve: advertising `prompts` and
# `resources` makes clients probe them (and `prompts/get` of any name answered error code 0).
UNSERVED_METHODS = ("prompts/list", "prompts/get", "resources/list", "resources/read",
                    "resources/templates/list")


class GatewayServer(FencedMCPServer[ServerState]):
    """MCPServer whose argument errors, unknown arguments and unknown tools also come back
    as structured `isError` answers (error_kind invalid_input), like every other failure;
    whose provider tools follow what is installed (listing.py); and which advertises only
    what it serves (tools, with listChanged)."""

    def __init__(self, state: ServerState, **kwargs: Any) -> None:
        bus = InMemorySubscriptionBus()
        self.listing = ToolListing(state, bus)
        super().__init__(tools=[], subscriptions=bus, **kwargs)
        self.state = state
        state.recheck_tools = self.recheck_tools
        self._accepted: dict[str, frozenset[str]] = {}
        self._tools_built = False
        self.drop_request_handlers(UNSERVED_METHODS)
        lowlevel = self.lowlevel
        # The tasks extension's `taskIds` on a listen (notifications/tasks); any other
        # listen is still the SDK's own handler's.
        lowlevel.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams,
                                     TaskListenHandler(state, bus))
        handshake_options = lowlevel.create_initialization_options

        def with_list_changed(notification_options: NotificationOptions | None = None,
                              *args: Any, **kw: Any) -> Any:
            return handshake_options(notification_options or LIST_CHANGED, *args, **kw)

        lowlevel.create_initialization_options = with_list_changed  # type: ignore[method-assign]
        self.middleware.append(self._remember_session)

    def _ensure_tools(self) -> None:
        """Build the tools at the first request that needs them, not at start: their schemas
        cost about 100 ms, and the first request of a 2026-07-28 client (server/discover) or
        the handshake of a legacy one needs none of them (bench/: startup_discover)."""
        if self._tools_built:
            return
        self._tools_built = True
        tools = self.listing.initial()
        self._describe_listing()
        for tool in tools:
            self._refuse_unknown_arguments(tool)
        others = self.tool_manager.list_tools()  # added by add_tool meanwhile
        self.tool_manager = ToolManager(tools=[*tools, *others], warn_on_duplicate_tools=False)

    def prepare_tools(self) -> None:
        self._ensure_tools()  # the SDK reads a tool's schema before a tools/call reaches call_tool

    async def _remember_session(self, ctx: Any, call_next: Any) -> Any:
        self.listing.remember(ctx)
        return await call_next(ctx)

    def add_tool(self, fn: Any, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        super().add_tool(fn, name, *args, **kwargs)
        tool = self.tool_manager.get_tool(name or fn.__name__)
        if tool is not None:
            self._refuse_unknown_arguments(tool)

    def _refuse_unknown_arguments(self, tool: Tool) -> None:
        self._accepted[tool.name] = frozenset(tool.parameters.get("properties", {}))
        # Unknown arguments are refused (call_tool); say so in the schema too.
        tool.parameters["additionalProperties"] = False

    async def recheck_tools(self) -> bool:
        """Re-list the provider tools if what is installed changed, and tell the clients."""
        if not self._tools_built:
            return False  # nothing was listed yet: the first listing looks at the machine
        await self.listing.refresh_workers()
        tools = self.listing.recheck()
        if tools is None:
            return False
        others = [t for t in self.tool_manager.list_tools() if not self.listing.managed(t.name)]
        for tool in tools:
            self._refuse_unknown_arguments(tool)
        self.tool_manager = ToolManager(tools=[*tools, *others], warn_on_duplicate_tools=False)
        self._describe_listing()
        await self.listing.announce()
        return True

    def _describe_listing(self) -> None:
        """Keep the `instructions` (read at each handshake) in step with the tool list."""
        self.lowlevel.instructions = instructions_for(
            self.listing.listed, self.state.setup_error)

    async def list_tools(self) -> list[MCPTool]:
        tools = None if self._tools_built else self.listing.cached_initial()
        if tools is not None:  # the last start's listing: derive the tools after answering
            self._describe_listing()
            asyncio.get_running_loop().call_later(BUILD_AFTER_CACHED_LISTING_S,
                                                  self._ensure_tools)
        else:
            self._ensure_tools()
            tools = await super().list_tools()
            self.listing.keep_initial(tools)
        if self.state.gateway is not None:
            self.state.gateway.start_soon(START_AFTER_LISTING_S)  # the handshake is over
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[ServerState, Any] | None = None) -> Any:
        self._ensure_tools()
        setup_error = self.state.setup_error
        if setup_error is not None and name != "gateway_status":
            return failure(ErrorKind.SETUP_ERROR, setup_error)
        if self.tool_manager.get_tool(name) is None:
            unlisted = await self._unlisted(name)
            if unlisted is not None:
                return unlisted
        accepted = self._accepted.get(name)
        if accepted is None:
            return failure(ErrorKind.INVALID_INPUT,
                           f"Unknown tool {name!r}. List the tools (tools/list) and call one "
                           f"of them.")
        unknown = sorted(set(arguments) - accepted)
        if unknown:
            return failure(ErrorKind.INVALID_INPUT,
                           f"Unknown argument(s) {unknown} for {name}. It accepts: "
                           f"{sorted(accepted)}. Remove the others and call again.")
        where = unencodable_path(arguments)
        if where is not None:
            return failure(ErrorKind.INVALID_INPUT,
                           f"Argument {where!r} of {name} is not valid Unicode (a lone UTF-16 "
                           f"surrogate, \\ud800-\\udfff without its pair). Send well-formed "
                           f"text and call again.")
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            log.error("tool crashed", action="tool_error", tool=name,
                      error=repr(exc.__cause__))
            return failure(ErrorKind.INTERNAL_ERROR,
                           f"Internal gateway error in {name}. Retry once; if it persists, "
                           f"report it with the gateway's stderr log.")
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                return invalid_arguments(name, exc.__cause__)
            return failure(ErrorKind.INVALID_INPUT, str(exc))

    async def _unlisted(self, name: str) -> Any:
        """A provider tool that is not listed: listed after all if its CLI just appeared,
        else the actionable `not_found` (None: not a provider tool, or listed now)."""
        provider = provider_of(name)
        if provider is None:
            return None
        await self.recheck_tools()
        if self.tool_manager.get_tool(name) is not None:
            return None
        return unlisted_answer(self.state.settings, provider)


def build_server(settings: Settings, role: str = "stdio",
                 setup_error: str | None = None,
                 read_capabilities: CapabilityReader | None = None) -> GatewayServer:
    """The MCP server with every tool. Its lifespan owns one Gateway per entry.

    With `setup_error` (the config could not be loaded) the server still serves, so the
    client's handshake succeeds and every tool answers the problem and its fix.
    """
    state = ServerState(settings, role, setup_error)

    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[ServerState]) -> AsyncIterator[ServerState]:
        if setup_error is not None:
            log.error("serving with a broken setup", action="serve", error=setup_error)
            yield state
            return
        # Loaded here, in the lifespan, not with the module (see the TYPE_CHECKING import).
        from gateway.runtime import Gateway  # deferred: start-up

        gateway = Gateway(settings, role=role, read_capabilities=read_capabilities)
        state.gateway = gateway
        state.versions = CliVersions(settings)  # fresh per entry (in-process reconnects)
        # Over HTTP there is no one client's handshake to wait for: start at once.
        gateway.start_in_background(START_DEFER_MAX_S if role == "stdio" else 0.0)
        probe = asyncio.create_task(_probe_versions_when_ready(state, gateway),
                                    name="cli_version_probe")
        recheck = asyncio.create_task(_recheck_tools_periodically(state), name="tools_recheck")
        log.info("MCP server started", action="serve", role=role,
                 instance_id=gateway.instance_id)
        try:
            yield state
        finally:
            recheck.cancel()
            state.versions.stop()
            await state.watches.close()  # before the gateway: a watch reads through it
            # Shielded: a cancelled serving task (SIGTERM) must still drain and deregister.
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(settings.lease.drain_timeout_s + STOP_MARGIN_S):
                    await gateway.stop()
                with anyio.move_on_after(PROBE_STOP_S):
                    with contextlib.suppress(Exception):
                        await asyncio.shield(probe)
                probe.cancel()
                await asyncio.gather(recheck, return_exceptions=True)
            state.gateway = None
            log.info("MCP server stopped", action="serve_stop", instance_id=gateway.instance_id)

    # The tools are built at the first request that needs them; the instructions are sent
    # with the handshake before that, so they look at the machine now (a PATH scan, < 1 ms).
    instructions = instructions_for(listed_providers(settings), setup_error)
    return GatewayServer(state, name=SERVER_NAME, version=__version__,
                         instructions=instructions, lifespan=lifespan, log_level="WARNING",
                         extensions=[TasksExtension(state, TASK_TOOLS)],
                         middleware=[LegacyTasksMiddleware(state, TASK_TOOLS)])


async def _recheck_tools_periodically(state: ServerState) -> None:
    """Follow CLIs installed or removed while the gateway runs (a PATH scan: cheap)."""
    while True:
        await asyncio.sleep(RECHECK_S)
        if state.recheck_tools is not None:
            try:
                await state.recheck_tools()
            except Exception as exc:
                log.warning("tool re-check failed", action="tools_recheck", error=repr(exc))


async def _probe_versions_when_ready(state: ServerState, gateway: Gateway) -> None:
    """Probe CLI versions in the background, after the store is open (startup first)."""
    await gateway.wait_ready(VERSION_PROBE_START_WAIT_S)
    try:
        await state.versions.probe_all()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("CLI version probe failed", action="probe_versions", error=repr(exc))
