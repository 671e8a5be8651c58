"""The MCP gateway (issue 45): MCP servers behind the gateway's keys, limits, records and
outbound rules. Wire-free: `gateway/api/mcp_endpoint.py` speaks HTTP to clients."""
