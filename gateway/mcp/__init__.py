"""The MCP front end: tools, results, stdio and Streamable HTTP transports."""
