"""The private names of the mcp SDK the gateway relies on (gateway/mcp/sdk_fence.py).

One test per name, on real SDK objects (an in-process client session where the name is
used on a request's path): each asserts the name exists and behaves as the fence uses it, so
an SDK release that renames or changes one fails here, by name.
"""

from __future__ import annotations

import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool, ToolManager
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from gateway.mcp import sdk_fence
from gateway.mcp.sdk_fence import FencedMCPServer

pytestmark = pytest.mark.anyio

CLASSES = {"MCPServer": MCPServer, "Server": Server,
           "StreamableHTTPSessionManager": StreamableHTTPSessionManager}


def echo(text: str) -> str:
    """Say it back."""
    return text


def test_every_fenced_name_is_on_the_sdk_class_it_is_said_to_be_on() -> None:
    server: FencedMCPServer[None] = FencedMCPServer(name="fence")
    manager = StreamableHTTPSessionManager(app=server.lowlevel)
    instances = {"MCPServer": server, "Server": server.lowlevel,
                 "StreamableHTTPSessionManager": manager}
    for owner, name in sdk_fence.PRIVATE_NAMES:
        assert isinstance(instances[owner], CLASSES[owner])
        assert hasattr(instances[owner], name), f"{owner}.{name} is gone"


def test_lowlevel_server_is_the_one_the_public_properties_read() -> None:
    server: FencedMCPServer[None] = FencedMCPServer(name="fence")
    assert isinstance(server.lowlevel, Server)
    server.lowlevel.instructions = "read these"
    assert server.instructions == "read these"  # MCPServer's property reads the same object


def test_request_handlers_can_be_dropped_by_method() -> None:
    server: FencedMCPServer[None] = FencedMCPServer(name="fence")
    assert server.lowlevel.get_request_handler("prompts/list") is not None
    server.drop_request_handlers(["prompts/list", "not/registered"])
    assert server.lowlevel.get_request_handler("prompts/list") is None
    assert server.lowlevel.get_request_handler("tools/list") is not None


async def test_a_replaced_tool_manager_is_what_tools_list_answers(anyio_backend: str) -> None:
    server: FencedMCPServer[None] = FencedMCPServer(name="fence")
    assert server.tool_manager.list_tools() == []
    server.tool_manager = ToolManager(tools=[Tool.from_function(echo)])
    async with Client(server) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
    assert names == ["echo"]


def test_the_tool_input_schema_the_sdk_reads_builds_the_tools_first() -> None:
    class LazyTools(FencedMCPServer[None]):
        prepared = 0

        def prepare_tools(self) -> None:
            # A tool that exists only once prepare_tools ran: its schema is found only if
            # the SDK's lookup went through _tool_input_schema (and so prepare_tools).
            self.prepared += 1
            if self.tool_manager.get_tool("echo") is None:
                self.tool_manager = ToolManager(tools=[Tool.from_function(echo)])

    server = LazyTools(name="fence")
    # The SDK hands MCPServer._tool_input_schema to the low-level server, which reads a
    # tool's schema through it (Streamable HTTP, 2026-07-28) before the call is dispatched.
    lookup = server.lowlevel.get_tool_input_schema
    assert lookup is not None
    schema = lookup("echo")
    assert server.prepared == 1
    assert schema is not None and "text" in schema["properties"]
    assert lookup("absent") is None


async def test_server_instances_and_discard_session_open_and_close_a_session(
        anyio_backend: str) -> None:
    server: FencedMCPServer[None] = FencedMCPServer(name="fence")
    manager = StreamableHTTPSessionManager(app=server.lowlevel)
    assert sdk_fence.open_session_ids(manager) == []
    transport = StreamableHTTPServerTransport(mcp_session_id="s1")
    manager._server_instances["s1"] = transport  # how the SDK registers an opened session
    assert sdk_fence.open_session_ids(manager) == ["s1"]
    assert sdk_fence.session_transport(manager, "s1") is transport
    await sdk_fence.discard_session(manager, "s1", transport)
    assert sdk_fence.open_session_ids(manager) == []
    assert sdk_fence.session_transport(manager, "s1") is None
    assert transport.is_terminated

