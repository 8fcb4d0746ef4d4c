"""Provider adapters: how to invoke each coding-agent CLI and how to read its output.

A provider knows nothing about jobs, stores or MCP (docs/architecture.md, Layers).
"""
