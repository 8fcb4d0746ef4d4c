"""agent-cli-gateway: durable jobs for coding-agent CLIs, served over MCP."""

__version__ = "0.2.0"
