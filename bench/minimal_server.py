"""The SDK's own floor: a minimal MCPServer with one no-op tool, served over stdio.

`bench/run.py` starts it and calls it exactly as it starts and calls the gateway (same
Python, same client, same transport), so what the SDK itself costs (importing `mcp`, the
handshake, one tool round trip, its resident memory) is divided out of every gateway row.
It must stay minimal: no store, no lifespan, no logging setup beyond the SDK's own.

    python bench/minimal_server.py      # serves MCP on stdin/stdout until EOF
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-minimal", log_level="WARNING")


@server.tool()
async def noop() -> str:
    """Does nothing and answers at once (async, like the gateway's tools: a sync tool would
    add a worker-thread hop that the gateway does not pay)."""
    return "ok"


if __name__ == "__main__":
    server.run("stdio")
