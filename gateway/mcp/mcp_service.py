"""The MCP gateway below HTTP: what a caller sees of the servers behind it (their tools,
resources and prompts, namespaced per server and filtered by its reach), and its calls
to them (the outbound scan on the way out and, where configured, on the way back; a
deadline; a cap on what comes back).

Names: a tool or a prompt of server `github` named `create_issue` is `github__create_issue`
to clients; a resource `file:///a` of server `fs` is `fs+file:///a` (the server's name
put before the URI's scheme, so that it stays a URI).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config.schema import McpConfig, McpServer, OutboundPolicy
from gateway.mcp.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RESOURCE_NOT_FOUND,
    RESULT_TOO_LARGE,
    UPSTREAM_ERROR,
    UPSTREAM_TIMEOUT,
    JsonRpcError,
)
from gateway.mcp.tool_reach import McpAccess
from gateway.mcp.tool_review import ToolReview
from gateway.mcp.upstream_peer import UpstreamFailure
from gateway.mcp.upstream_pool import UpstreamPool
from gateway.observability import metrics
from gateway.observability.logging import redact

log = logging.getLogger("gateway.mcp")

SEPARATOR = "__"
# A server left out of listings for one reason is logged so once a minute.
SAID_EVERY_S = 60.0
# Values the outbound scan reads on the event loop; larger ones on a thread.
SCAN_ON_LOOP_BYTES = 8 * 1024
# Longest name MCP allows a tool (2025-11-25: 1 to 128 characters).
MAX_NAME_CHARS = 128
# How long one server may take to list, before a listing goes on without it.
LISTING_TIMEOUT_S = 10.0
# An upstream's own error codes passed on to the client only in this range (JSON-RPC's
# and MCP's); anything else is the gateway's UPSTREAM_ERROR.
_PASSED_CODES = range(-32768, -31999)

# The scan of a value leaving for (or coming back from) an external server: (request id,
# tenant, server, policy, value) -> the value to send, masked; raises when it blocks.
Scan = Callable[[str, str, str, OutboundPolicy, Any], Any]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls: its tenant, key, reach, and the request it came in."""

    tenant: str
    key_id: str
    access: McpAccess
    request_id: str
    # The tenant's own outbound policy for external servers (None: each server's).
    outbound: OutboundPolicy | None = None


@dataclass(slots=True)
class CallStats:
    """What one tool call moved and how it ended, for its record and the metrics."""

    # The server and tool, once the call is known to be allowed ("-" before).
    server: str = "-"
    tool: str = "-"
    bytes_in: int = 0
    bytes_out: int = 0
    outcome: str = "ok"


def public_name(server: str, name: str) -> str:
    return f"{server}{SEPARATOR}{name}"


def split_name(name: str) -> tuple[str, str] | None:
    """A public tool or prompt name's server and upstream name (None: not one of ours)."""
    server, found, rest = name.partition(SEPARATOR)
    return (server, rest) if found and server and rest else None


class McpService:
    """The servers behind `/mcp`, as each caller may see and call them."""

    def __init__(
        self, config: McpConfig, pool: UpstreamPool, review: ToolReview, scan: Scan
    ) -> None:
        self._config = config
        self._pool = pool
        self._review = review
        self._scan = scan
        # Why a server was last left out of a listing, and when that was said.
        self._said: dict[tuple[str, str], float] = {}

    @property
    def servers(self) -> dict[str, McpServer]:
        return self._config.servers

    def visible_servers(self, caller: Caller) -> list[str]:
        return [name for name in self._config.servers if caller.access.sees_server(name)]

    async def _listings(self, caller: Caller, kind: str) -> list[tuple[str, list[dict[str, Any]]]]:
        """Each visible server's listing of `kind`, in parallel; a server that fails is
        left out (and logged), not the whole answer."""
        servers = self.visible_servers(caller)

        async def one(server: str) -> list[dict[str, Any]]:
            async with asyncio.timeout(LISTING_TIMEOUT_S):
                return await self._pool.listing(caller.tenant, server, kind)

        found = await asyncio.gather(*(one(s) for s in servers), return_exceptions=True)
        listings = []
        for server, result in zip(servers, found, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                why = (
                    result.message if isinstance(result, UpstreamFailure) else type(result).__name__
                )
                if len(self._said) > 1000:
                    self._said.clear()
                if self._said.get((server, why), 0.0) < time.monotonic() - SAID_EVERY_S:
                    self._said[(server, why)] = time.monotonic()
                    log.warning("MCP server %s left out of listings: %s", server, why)
                continue
            listings.append((server, result))
        return listings

    async def list_tools(self, caller: Caller) -> list[dict[str, Any]]:
        """The tools the caller may call, by their public names."""
        tools: list[dict[str, Any]] = []
        for server, listed in await self._listings(caller, "tools"):
            named = _well_named(server, listed)
            allowed = [t for t in named if caller.access.allows(server, t["name"])]
            shown = await self._review.allowed(server, allowed)
            for tool, ok in zip(allowed, shown, strict=True):
                if ok:
                    tools.append({**tool, "name": public_name(server, tool["name"])})
        return tools

    async def list_prompts(self, caller: Caller) -> list[dict[str, Any]]:
        """The prompts of the servers the caller sees, by their public names."""
        prompts = []
        for server, listed in await self._listings(caller, "prompts"):
            for prompt in listed:
                if isinstance(prompt.get("name"), str):
                    prompts.append({**prompt, "name": public_name(server, prompt["name"])})
        return prompts

    async def list_resources(self, caller: Caller, templates: bool) -> list[dict[str, Any]]:
        """The resources (or resource templates) of the servers the caller sees, their
        URIs under the server's name."""
        kind, field = ("resource_templates", "uriTemplate") if templates else ("resources", "uri")
        found = []
        for server, listed in await self._listings(caller, kind):
            for resource in listed:
                if isinstance(resource.get(field), str):
                    found.append({**resource, field: f"{server}+{resource[field]}"})
        return found

    def _server_of(self, caller: Caller, server: str) -> McpServer:
        config = self._config.servers.get(server)
        if config is None or not caller.access.sees_server(server):
            raise JsonRpcError(INVALID_PARAMS, "unknown name")
        return config

    async def call_tool(
        self, caller: Caller, name: str, arguments: Any, stats: CallStats
    ) -> dict[str, Any]:
        """Call a tool by its public name: allowed, reviewed, scanned, within its
        deadline and cap. An unknown tool and one the caller may not call get the same
        error: what is not allowed is not told apart from what is not there."""
        parts = split_name(name)
        if parts is None:
            stats.outcome = "refused"
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name[:MAX_NAME_CHARS]}")
        server, tool = parts
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            stats.outcome = "refused"
            raise JsonRpcError(INVALID_PARAMS, "arguments is an object")
        config = self._config.servers.get(server)
        if config is None or not caller.access.allows(server, tool):
            stats.outcome = "refused"
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name[:MAX_NAME_CHARS]}")
        listed = await self._listed_tool(caller, server, tool)
        if listed is None:
            stats.outcome = "refused"
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name[:MAX_NAME_CHARS]}")
        # Named only now: a metric's labels are what the configured servers list, never
        # whatever a client sends.
        stats.server, stats.tool = server, tool
        stats.bytes_in = len(orjson.dumps(arguments))
        if config.external:
            arguments = await self._scanned(
                caller, server, config, arguments, stats.bytes_in, stats
            )
        started = time.perf_counter()
        try:
            result = await self._pool.call(
                caller.tenant,
                server,
                "tools/call",
                {"name": tool, "arguments": arguments},
                config.timeout_s,
            )
        except UpstreamFailure as failure:
            stats.outcome = failure.outcome
            raise _client_error(failure) from None
        finally:
            metrics.MCP_CALL_SECONDS.labels(server).observe(time.perf_counter() - started)
        stats.bytes_out = len(orjson.dumps(result))
        if config.external and config.scan_results:
            result = await self._scanned(caller, server, config, result, stats.bytes_out, stats)
        if result.get("isError") is True:
            stats.outcome = "tool_error"
        return _prefixed_links(server, result)

    async def _listed_tool(self, caller: Caller, server: str, tool: str) -> dict[str, Any] | None:
        """The tool as its server lists it now, if clients may see it (a call to a held
        tool is refused as an unknown one)."""
        try:
            listed = await self._pool.listing(caller.tenant, server, "tools")
        except UpstreamFailure as failure:
            raise _client_error(failure) from None
        for candidate in _well_named(server, listed):
            if candidate["name"] == tool:
                (ok,) = await self._review.allowed(server, [candidate])
                return candidate if ok else None
        return None

    async def _scanned(
        self,
        caller: Caller,
        server: str,
        config: McpServer,
        value: Any,
        size: int,
        stats: CallStats | None = None,
    ) -> Any:
        """`value` through the outbound scan (on a thread of its own past a few KB: a
        large one would hold the event loop, every tenant's requests with it)."""
        policy = caller.outbound or config.outbound
        scan = (caller.request_id, caller.tenant, server, policy, value)
        try:
            if size > SCAN_ON_LOOP_BYTES:
                return await asyncio.to_thread(self._scan, *scan)
            return self._scan(*scan)
        except Exception:
            if stats is not None:
                stats.outcome = "blocked"
            raise

    async def read_resource(self, caller: Caller, uri: Any) -> dict[str, Any]:
        """A resource by its public URI, from the server it names."""
        if not isinstance(uri, str):
            raise JsonRpcError(INVALID_PARAMS, "uri is a string")
        server, found, original = uri.partition("+")
        config = self._config.servers.get(server)
        if not found or config is None or not caller.access.sees_server(server):
            # A server out of the caller's reach reads as one that is not there.
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri[:1000]})
        return await self._forward(caller, server, config, "resources/read", {"uri": original})

    async def get_prompt(self, caller: Caller, name: Any, arguments: Any) -> dict[str, Any]:
        """A prompt by its public name."""
        parts = split_name(name) if isinstance(name, str) else None
        if parts is None:
            raise JsonRpcError(INVALID_PARAMS, "unknown prompt")
        server, prompt = parts
        config = self._server_of(caller, server)
        params: dict[str, Any] = {"name": prompt}
        if isinstance(arguments, dict):
            params["arguments"] = arguments
        return await self._forward(caller, server, config, "prompts/get", params)

    async def _forward(
        self, caller: Caller, server: str, config: McpServer, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            result = await self._pool.call(caller.tenant, server, method, params, config.timeout_s)
        except UpstreamFailure as failure:
            raise _client_error(failure) from None
        if config.external and config.scan_results:
            result = await self._scanned(caller, server, config, result, len(orjson.dumps(result)))
        return _prefixed_links(server, result)


def _prefixed_links(server: str, result: dict[str, Any]) -> dict[str, Any]:
    """`result` with the URIs it holds of its server's resources (read contents, resource
    links, embedded resources) under the server's name, as clients read them back."""
    contents = result.get("contents")
    if isinstance(contents, list):
        result = {**result, "contents": [_prefixed(server, item) for item in contents]}
    content = result.get("content")
    if isinstance(content, list):
        result = {**result, "content": [_prefixed_content(server, item) for item in content]}
    return result


def _prefixed(server: str, item: Any) -> Any:
    if isinstance(item, dict) and isinstance(item.get("uri"), str):
        return {**item, "uri": f"{server}+{item['uri']}"}
    return item


def _prefixed_content(server: str, item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    if item.get("type") == "resource_link":
        return _prefixed(server, item)
    if item.get("type") == "resource":
        return {**item, "resource": _prefixed(server, item.get("resource"))}
    return item


# A tool's name as MCP advises it (1 to 128 of these), and as the gateway serves it: a
# server's other names are left out before anything is kept of them (pins, held tools).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _well_named(server: str, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools of a listing whose names the gateway serves: MCP's characters, and
    short enough to be named `{server}__{tool}` in 128."""
    most = MAX_NAME_CHARS - len(server) - len(SEPARATOR)
    return [
        tool
        for tool in listed
        if isinstance(name := tool.get("name"), str)
        and len(name) <= most
        and _TOOL_NAME.fullmatch(name) is not None
    ]


def _client_error(failure: UpstreamFailure) -> JsonRpcError:
    """What the client is told of an upstream's failure: its message redacted (a server
    may echo what it was given, its credentials included)."""
    message = redact(failure.message[:2000])
    if failure.outcome == "error" and failure.code is not None:
        code = failure.code if failure.code in _PASSED_CODES else UPSTREAM_ERROR
        if code == METHOD_NOT_FOUND:
            code = UPSTREAM_ERROR  # the client asked the gateway, which has the method
        return JsonRpcError(code, message)
    codes = {"timeout": UPSTREAM_TIMEOUT, "too_large": RESULT_TOO_LARGE}
    return JsonRpcError(codes.get(failure.outcome, UPSTREAM_ERROR), message)
