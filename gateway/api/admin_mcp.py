"""`/admin/mcp/tools`: the MCP tools held from clients (a description or schema changed
since first listed, or one that reads as instructions to the model), and an operator's
acceptance of one (`gateway mcp held`, `gateway mcp accept`). The gateway's own admins
only: a held tool is every tenant's."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.endpoints import admin_identity
from gateway.api.errors import APIError, bad_request
from gateway.api.mcp_endpoint import gateway_of


async def held_tools(request: Request) -> Response:
    """`GET /admin/mcp/tools`: the held tools, each with why and what it says now."""
    await admin_identity(request)
    held = await gateway_of(request).review.held()
    return Response(
        orjson.dumps({"held": [tool.as_dict() for tool in held]}), media_type="application/json"
    )


async def accept_tool(request: Request) -> Response:
    """`POST /admin/mcp/tools/accept` `{"server": ..., "tool": ...}`: the tool as it is
    now is pinned, and shown to clients again."""
    await admin_identity(request)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise bad_request("The request body is not valid JSON.") from None
    server = body.get("server") if isinstance(body, dict) else None
    tool = body.get("tool") if isinstance(body, dict) else None
    if not isinstance(server, str) or not isinstance(tool, str):
        raise bad_request("Give `server` and `tool`, the names of a held tool.")
    mcp = gateway_of(request)
    accepted = await mcp.review.accept(server, tool)
    if accepted is None:
        raise APIError(404, f"No tool {server}/{tool} is held.", code="tool_not_held")
    await mcp.announce_change(server)
    return Response(orjson.dumps({"accepted": accepted.as_dict()}), media_type="application/json")
