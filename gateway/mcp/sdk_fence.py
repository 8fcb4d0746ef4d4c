"""Every private name of the `mcp` SDK the gateway uses, behind this one module.

The SDK has no public way to do a few things this server needs, so it reaches past the
underscore here and nowhere else (the rest of gateway/mcp/ calls the functions below):

- `MCPServer._lowlevel_server`: the low-level server, to run it on our own stdio streams
  (serve.py), to patch the handshake's capabilities and to set `instructions` (server.py);
- `Server._request_handlers`: to drop handlers the SDK registers for what this server does
  not serve (`prompts/*`, `resources/*`), so clients do not probe them;
- `MCPServer._tool_manager`: to read the registered tools and to swap in a rebuilt list
  when the installed CLIs change (listing.py);
- `MCPServer._tool_input_schema`: handed to the low-level server, which reads a tool's
  schema through it (Streamable HTTP) before a `tools/call` is dispatched;
  `FencedMCPServer` overrides it so the tools exist by then (they are built lazily:
  bench/README.md, startup);
- `StreamableHTTPSessionManager._server_instances` and `._discard_session`: the open HTTP
  sessions, and closing one, to evict the least recently used idle session at the cap
  (sessions.py).

pyproject pins mcp to the minor release these were checked on (`mcp>=2.3,<2.4`), and
tests/mcp/test_sdk_fence.py asserts each name exists and behaves as used here, so an SDK
upgrade that moves one fails there, by name, first (tests/test_packaging.py holds the pin).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import ToolManager
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

StateT = TypeVar("StateT")

# The private names, for the fence's test: (the class that has it, the name).
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("MCPServer", "_lowlevel_server"),
    ("MCPServer", "_tool_manager"),
    ("MCPServer", "_tool_input_schema"),
    ("Server", "_request_handlers"),
    ("StreamableHTTPSessionManager", "_server_instances"),
    ("StreamableHTTPSessionManager", "_discard_session"),
)


class FencedMCPServer(MCPServer[StateT]):
    """MCPServer with the private parts this gateway needs as named, typed members."""

    @property
    def lowlevel(self) -> Server[StateT]:
        """The low-level server the SDK wraps (handshake options, `instructions`, `run`)."""
        return self._lowlevel_server

    @property
    def tool_manager(self) -> ToolManager:
        """The registry of tools `tools/list` and `tools/call` read."""
        return self._tool_manager

    @tool_manager.setter
    def tool_manager(self, manager: ToolManager) -> None:
        self._tool_manager = manager

    def drop_request_handlers(self, methods: Iterable[str]) -> None:
        """Unregister the SDK's handlers of `methods` (absent ones are ignored)."""
        handlers = self._lowlevel_server._request_handlers
        for method in methods:
            handlers.pop(method, None)

    def prepare_tools(self) -> None:
        """Called before the SDK reads any tool's input schema: build tools here."""

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        self.prepare_tools()  # the SDK reads the schema before a tools/call reaches call_tool
        return super()._tool_input_schema(name)


def open_session_ids(manager: StreamableHTTPSessionManager) -> list[str]:
    """The ids of the HTTP sessions the SDK holds open."""
    return list(manager._server_instances)


def session_transport(manager: StreamableHTTPSessionManager,
                      session_id: str) -> StreamableHTTPServerTransport | None:
    """The transport of one open session (None: not open, or already ended)."""
    return manager._server_instances.get(session_id)


async def discard_session(manager: StreamableHTTPSessionManager, session_id: str,
                          transport: StreamableHTTPServerTransport) -> None:
    """Close one session as the SDK itself does: forgotten at once (its id answers 404 from
    then on), its transport terminated even if the caller is cancelled."""
    await manager._discard_session(session_id, transport)
