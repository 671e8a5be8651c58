"""The completion endpoints served without Starlette's layers: the request path is hot.

Starlette passes every request through two middlewares, a router that tries each
route's pattern in turn and two exception wrappers, and every message sent back through
three closures. For the endpoints that carry the traffic, `DirectRoutes` calls the
handler itself and turns its exceptions into responses with the app's own handler;
everything else (lifespan, the other routes, unknown paths, other methods) goes to the
Starlette app as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class DirectRoutes:
    """ASGI app: POSTs to `routes` go straight to their endpoint, the rest to `app`."""

    def __init__(self, app: Starlette, routes: Mapping[str, Endpoint], on_error: ErrorHandler):
        self.app = app
        self._routes = dict(routes)
        self._on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._routes.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self.app  # what `request.app` finds, as under Starlette
                request = Request(scope, receive)
                try:
                    response = await endpoint(request)
                except Exception as exc:
                    response = await self._on_error(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
