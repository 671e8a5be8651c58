"""The gateway as an MCP client of one upstream server: what both transports share.

An upstream is not trusted. Every message it sends is bounded (a transport refuses one
past the server's `max_result_bytes`), every call has a deadline, and what it sends
unasked (notifications, requests of its own, lines that are not JSON-RPC) is paid for
from a small budget: a server that floods is cut off and rested, so that it costs the
gateway's event loop, and the other tenants on it, next to nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.mcp.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND

log = logging.getLogger("gateway.mcp")

# The protocol version the gateway asks its upstreams for: the newest of the handshake
# era, which every deployed server speaks (docs/design/mcp-gateway.md).
UPSTREAM_PROTOCOL_VERSION = "2025-11-25"
CLIENT_INFO = {"name": "inference-gateway", "version": "0.1.0"}
# Unasked messages an upstream may send: a rate per second and a burst.
UNASKED_PER_S = 50.0
UNASKED_BURST = 200.0

# What the gateway is told of an upstream's notification: its method and params.
NotificationSink = Callable[[str, dict[str, Any]], None]


class UpstreamFailure(Exception):
    """A call that got no usable answer. `outcome` says why, for the ledger and the
    metrics: `error` (the server answered a JSON-RPC error: `code`, `message` are its),
    `timeout`, `too_large`, `unavailable` (not started, gone, cut off), `malformed`."""

    def __init__(self, outcome: str, message: str, code: int | None = None, data: Any = None):
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.code = code
        self.data = data


class UnaskedBudget:
    """The token bucket of an upstream's unasked messages."""

    def __init__(self, per_s: float = UNASKED_PER_S, burst: float = UNASKED_BURST) -> None:
        self._per_s, self._burst = per_s, burst
        self._level, self._at = burst, time.monotonic()

    def take(self) -> bool:
        """Whether one more unasked message is within the budget."""
        now = time.monotonic()
        self._level = min(self._burst, self._level + (now - self._at) * self._per_s)
        self._at = now
        if self._level < 1:
            return False
        self._level -= 1
        return True


class UpstreamPeer:
    """Request ids, the calls waiting for their answers, and what the server sends
    unasked. A transport sends (`_send`) and hands every message it reads to `received`."""

    def __init__(self, name: str, on_notification: NotificationSink) -> None:
        self.name = name
        self._on_notification = on_notification
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._budget = UnaskedBudget()
        self.closed = False
        # Why it was cut off, when it was: what its calls are told.
        self.failure: UpstreamFailure | None = None

    def next_id(self) -> int:
        return next(self._ids)

    def expect(self, request_id: int) -> asyncio.Future[dict[str, Any]]:
        """The future of request `request_id`'s response."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def forget(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)

    def received(self, message: Any, reply: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Dispatch one message the server sent: a response to its call; a notification
        to the sink; a request of its own answered by `reply` (ping; nothing else is
        offered to upstreams). Anything else, and every unasked message past the
        budget, counts against the server: past it, `cut_off`."""
        if isinstance(message, dict) and "method" not in message and "id" in message:
            future = self._waiting.pop(message["id"], None) if _hashable(message["id"]) else None
            if future is not None and not future.done():
                future.set_result(message)
                return
        if not self._budget.take():
            self.cut_off(
                UpstreamFailure("unavailable", f"MCP server {self.name} flooded the gateway")
            )
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return  # a response to nothing, or not JSON-RPC: dropped, paid for
        method, params = message["method"], message.get("params")
        params = params if isinstance(params, dict) else {}
        if "id" in message and _hashable(message["id"]):
            answer = self._answer(message["id"], method)
            asyncio.get_running_loop().create_task(_quietly(reply(answer)))
            return
        self._on_notification(method, params)

    @staticmethod
    def _answer(request_id: Any, method: str) -> dict[str, Any]:
        if method == "ping":
            return {"jsonrpc": "2.0", "id": request_id, "result": {}}
        # No roots, sampling or elicitation are offered: the gateway is not a person.
        error = {"code": METHOD_NOT_FOUND, "message": f"the gateway does not serve {method}"}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}

    def cut_off(self, failure: UpstreamFailure, *, quiet: bool = False) -> None:
        """End every waiting call with `failure`; the transport closes (`quiet`: as the
        gateway asked, nothing to log)."""
        if self.failure is None:
            self.failure = failure
            if not quiet:
                log.warning("MCP server %s cut off: %s", self.name, failure.message)
        self.closed = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(failure)
        self._waiting.clear()


def result_of(name: str, response: dict[str, Any]) -> dict[str, Any]:
    """The result of a response, or its error as `UpstreamFailure`."""
    if "error" in response:
        error = response["error"] if isinstance(response["error"], dict) else {}
        code = error.get("code")
        message = error.get("message")
        return _raise(
            UpstreamFailure(
                "error",
                message if isinstance(message, str) else f"MCP server {name} answered an error",
                code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR,
                error.get("data"),
            )
        )
    result = response.get("result")
    if not isinstance(result, dict):
        raise UpstreamFailure("malformed", f"MCP server {name} answered no result object")
    return result


def _raise(failure: UpstreamFailure) -> dict[str, Any]:
    raise failure


def _hashable(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


async def _quietly(sending: Awaitable[None]) -> None:
    try:
        await sending
    except Exception:
        log.debug("an answer to an MCP server's request was not sent", exc_info=True)
