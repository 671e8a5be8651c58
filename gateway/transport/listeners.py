"""Two listeners in one process: the API port and the ops port.

Every worker serves both sockets (uvicorn accepts a list). Which one a request came in
on is the local address of its connection (`scope["server"]`); requests to the ops port
go to the ops app, so no route of one is reachable through the other.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class Listeners:
    """ASGI app: requests to `ops_port` go to `ops`, everything else (lifespan too) to
    `api`."""

    def __init__(self, api: ASGIApp, ops: ASGIApp, ops_port: int) -> None:
        self.api = api
        self.ops = ops
        self._ops_port = ops_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if server is not None and server[1] == self._ops_port and scope["type"] == "http":
            await self.ops(scope, receive, send)
        else:
            await self.api(scope, receive, send)
