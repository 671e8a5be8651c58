"""MCP servers of the tests' own, run behind the gateway: one that behaves
(`notes_server.py`, the `mcp` SDK's own server) and one that does not
(`hostile_server.py`, raw JSON-RPC)."""
