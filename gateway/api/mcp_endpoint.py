"""`/mcp`: the MCP servers behind the gateway as one server, over Streamable HTTP in
both of its eras (docs/mcp.md): 2026-07-28, stateless, and 2025-11-25 (and older), with
its handshake and sessions.

Every request is served as the gateway serves any (`counted.serve_counted`): the
caller's key (Bearer) names its tenant, the request counts once against its request
limits (a tool call against the tool's own rate too, on the same Lua call), and it ends
in one record, a tool call's with its server, tool, bytes and outcome for the ledger.
Refusals are JSON-RPC error objects with the HTTP status that fits (401 with
`WWW-Authenticate: Bearer`, 429 with `Retry-After`); a tool's own failure is a JSON-RPC
error with status 200, as the specification has it.

- POST: one JSON-RPC message. A request that names 2026-07-28 stands alone
  (`server/discover` says what is served). Otherwise `initialize` begins a session
  (`Mcp-Session-Id`, kept in Redis: any gateway serves its next request), and every
  other request names its session.
- GET: the session's stream of list-changed notifications, each with an event id; a
  client that comes back with `Last-Event-ID` gets what it missed, from any gateway.
- DELETE: ends the session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.api.body import too_deep
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.endpoints import runtime_of
from gateway.api.errors import APIError
from gateway.api.exchange import read_body
from gateway.config.schema import McpConfig, ToolChangePolicy
from gateway.mcp.client_sessions import ClientSession, SessionStore, TooManySessions
from gateway.mcp.jsonrpc import (
    BLOCKED,
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RATE_LIMITED,
    JsonRpcError,
    Message,
    RequestId,
    parse_message,
)
from gateway.mcp.jsonrpc import error as error_message
from gateway.mcp.jsonrpc import result as result_message
from gateway.mcp.mcp_service import SEPARATOR, Caller, CallStats, McpService, split_name
from gateway.mcp.tool_reach import McpAccess
from gateway.mcp.tool_review import ToolReview
from gateway.mcp.upstream_pool import UpstreamPool
from gateway.observability import metrics
from gateway.observability.access import RequestRecord
from gateway.observability.logging import redact
from gateway.ratelimit.limit_plan import MCP_TOOL_PREFIX
from gateway.serving.auth import Identity
from gateway.serving.errors import RateLimited
from gateway.serving.outbound import SensitiveDataBlocked
from gateway.serving.runtime import Runtime
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.mcp")

# The handshake-era versions served, newest first: a client asking for another is
# answered with the newest (it may then disconnect, as the specification says).
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SERVER_INFO = {"name": "inference-gateway", "title": "Inference gateway (MCP)", "version": "0.1.0"}
INSTRUCTIONS = (
    "The tools of the MCP servers behind this gateway: each named {server}" + SEPARATOR + "{tool}."
)
# The stateless era (2026-07-28): no session, each request says its version.
MODERN_VERSIONS = ("2026-07-28",)
# No `logging`: the servers' log messages are not relayed (`logging/setLevel` is
# still answered, for a client that sends it anyway).
CAPABILITIES = {
    "tools": {"listChanged": True},
    "resources": {"listChanged": True},
    "prompts": {"listChanged": True},
}
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
# The param each name-bearing method's `Mcp-Name` repeats.
NAME_PARAMS = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name"}
# Results a 2026-07-28 client may cache (for 0 ms: what a caller sees is its own).
CACHEABLE = frozenset(
    {"tools/list", "resources/list", "resources/templates/list", "prompts/list", "resources/read"}
)
# How often a session's stream looks for new events, and sends a comment to keep its
# connection open.
EVENTS_POLL_S = 1.0
KEEPALIVE_S = 15.0
# What the access line shows of a call's arguments and result, with `log_prompts`.
LOGGED_CHARS = 4096
# Streams one tenant may hold open on one gateway process.
MAX_STREAMS_PER_TENANT = 16
# The kind of an event and the notification it is sent as.
NOTIFICATIONS = {
    "tools": "notifications/tools/list_changed",
    "resources": "notifications/resources/list_changed",
    "resource_templates": "notifications/resources/list_changed",
    "prompts": "notifications/prompts/list_changed",
}
_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "logging/setLevel",
    }
)


@dataclass(slots=True)
class McpGateway:
    """What `/mcp` serves with: the service, the sessions, and the streams open here."""

    config: McpConfig
    service: McpService
    sessions: SessionStore
    pool: UpstreamPool
    review: ToolReview
    # The tenants now configured (a reload changes them).
    tenant_names: Callable[[], Iterable[str]]
    streams: dict[str, int] = field(default_factory=dict)
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def build(cls, runtime: Runtime) -> McpGateway:
        config = runtime.config.gateway.mcp
        prefix = runtime.config.gateway.redis.key_prefix
        sessions = SessionStore(
            runtime.redis,
            prefix,
            config.session_idle_s,
            config.events_kept,
            config.max_sessions_per_tenant,
        )
        review = ToolReview(
            runtime.redis,
            prefix,
            config.max_description_chars,
            hide=config.on_tool_change is ToolChangePolicy.HIDE,
        )

        def changed(tenant: str, server: str, kind: str) -> None:
            task = asyncio.get_running_loop().create_task(sessions.publish(tenant, server, kind))
            task.add_done_callback(_log_failure)

        pool = UpstreamPool(config.servers, changed, config.max_tools_per_server)
        service = McpService(config, pool, review, runtime.outbound.scan_json)
        return cls(config, service, sessions, pool, review, lambda: runtime.config.tenants.tenants)

    def start(self) -> None:
        self.pool.start()

    async def announce_change(self, server: str) -> None:
        """Tell every tenant's sessions that `server`'s tools changed (an operator
        accepted a held one)."""
        for tenant in list(self.tenant_names()):
            await self.sessions.publish(tenant, server, "tools")

    async def close(self) -> None:
        self.closing.set()
        await self.pool.close()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("an MCP list change was not published: %s", task.exception())


def gateway_of(request: Request) -> McpGateway:
    mcp: McpGateway = request.app.state.mcp
    return mcp


@dataclass(slots=True)
class _Exchange:
    """One request's JSON-RPC id, once read: its errors answer it."""

    id: RequestId | None = None


class McpRefusal(APIError):
    """A refusal of a request as MCP answers it: a JSON-RPC error, with an HTTP status."""

    def __init__(self, status: int, rpc: JsonRpcError, headers: dict[str, str] | None = None):
        super().__init__(status, rpc.message, headers=headers, reason="mcp_refused")
        self.rpc = rpc


def _render(error: APIError, exchange: _Exchange) -> Response:
    """A refusal as a JSON-RPC error object, with its status and headers."""
    if isinstance(error, McpRefusal):
        rpc = error.rpc
    elif error.status == 401:
        rpc = JsonRpcError(
            INVALID_REQUEST, "Invalid API key: send the gateway key as a Bearer token"
        )
        error.headers["WWW-Authenticate"] = "Bearer"
    elif error.status == 429:
        rpc = JsonRpcError(RATE_LIMITED, error.message)
    else:
        rpc = JsonRpcError(INVALID_REQUEST, error.message)
    return error.response(error_message(exchange.id, rpc))


def _origin_allowed(request: Request, config: McpConfig) -> bool:
    origin = request.headers.get("origin")
    return origin is None or origin in config.allowed_origins


# What a request's handler is given: its caller, its record, its count, and the place
# its JSON-RPC id goes once read (so that a refusal answers it).
Handler = Callable[
    [Request, Identity, RequestRecord, CountRequest, "_Exchange"], Awaitable[Response]
]


async def _served(request: Request, handler: Handler) -> Response:
    """A request to `/mcp` served as every request is (`serve_counted`), its refusals as
    JSON-RPC errors."""
    exchange = _Exchange()

    async def handle(
        request: Request, identity: Identity, record: RequestRecord, count: CountRequest
    ) -> Response:
        try:
            return await handler(request, identity, record, count, exchange)
        except REDIS_ERRORS:
            # Sessions, events and pins are in Redis: without it (or with its pool spent
            # by a burst), a refusal to come back, not a 500.
            metrics.REDIS_ERRORS.labels("mcp").inc()
            busy = JsonRpcError(INTERNAL_ERROR, "The gateway cannot reach its store now: retry")
            raise McpRefusal(503, busy, {"Retry-After": "1"}) from None

    return await serve_counted(
        request, "mcp", handle, render_error=lambda error: _render(error, exchange)
    )


async def post(request: Request) -> Response:
    """One JSON-RPC message from a client."""
    return await _served(request, _post)


async def _post(
    request: Request,
    identity: Identity,
    record: RequestRecord,
    count: CountRequest,
    exchange: _Exchange,
) -> Response:
    mcp = gateway_of(request)
    _check_headers(request, mcp.config, post=True)
    body = await read_body(request, runtime_of(request).config.gateway.server.max_body_bytes)
    message = _message(body)
    exchange.id = message.id
    record.alias = (message.method or "response")[:128]
    if _modern(request, message):
        return await _serve_modern(request, mcp, identity, message, record, count)
    if message.method == "initialize" and message.is_request:
        await count("")
        return await _initialize(mcp, identity, message)
    if message.is_request and message.method not in _METHODS:
        await count("")
        rpc = JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
        return _json(error_message(message.id, rpc))
    await _session(mcp, request, identity)
    if not message.is_request:
        await count("")
        return Response(status_code=202)  # a notification, or an answer: taken
    return await _answer(request, mcp, identity, message, record, count, modern=False)


async def _answer(
    request: Request,
    mcp: McpGateway,
    identity: Identity,
    message: Message,
    record: RequestRecord,
    count: CountRequest,
    *,
    modern: bool,
) -> Response:
    """A request's answer, in either era (its session, if any, found already)."""
    assert message.id is not None
    if message.method == "tools/call":
        log_prompts = runtime_of(request).config.gateway.server.log_prompts
        return await _call_tool(mcp, identity, message, record, count, log_prompts, modern)
    await count("")
    try:
        result = await _serve(mcp.service, _caller(identity, record), message)
    except JsonRpcError as rpc:
        return _json(error_message(message.id, rpc))
    return _json(result_message(message.id, _stamped(result, message.method, modern)))


def _modern(request: Request, message: Message) -> bool:
    """Whether the request is of the stateless 2026-07-28 era: its version header, or
    the version its `_meta` names."""
    if request.headers.get(VERSION_HEADER) in MODERN_VERSIONS:
        return True
    meta = message.params.get("_meta")
    return isinstance(meta, dict) and meta.get(PROTOCOL_VERSION_META) in MODERN_VERSIONS


async def _serve_modern(
    request: Request,
    mcp: McpGateway,
    identity: Identity,
    message: Message,
    record: RequestRecord,
    count: CountRequest,
) -> Response:
    """A request of the 2026-07-28 era: no session, no handshake; `Mcp-Method` (and
    `Mcp-Name`) checked against the body; every result `resultType: complete`."""
    # What a proxy in front routes and authorizes by must say what the body says: both
    # headers are required, and compared whole (a non-ASCII value as the SDKs encode it).
    if message.method and _header_value(request, METHOD_HEADER) != message.method:
        rpc = JsonRpcError(HEADER_MISMATCH, "Mcp-Method is missing or not the body's method")
        raise McpRefusal(400, rpc)
    named = message.params.get(NAME_PARAMS.get(message.method, ""))
    if message.method in NAME_PARAMS and _header_value(request, NAME_HEADER) != named:
        rpc = JsonRpcError(HEADER_MISMATCH, "Mcp-Name is missing or not the body's name")
        raise McpRefusal(400, rpc)
    if not message.is_request:
        await count("")
        return Response(status_code=202)
    if message.method == "server/discover":
        await count("")
        return _json(result_message(message.id or 0, _discovered()))
    if message.method not in _METHODS or message.method == "initialize":
        await count("")
        rpc = JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
        return _json(error_message(message.id, rpc), status=404)
    return await _answer(request, mcp, identity, message, record, count, modern=True)


def _header_value(request: Request, name: str) -> str | None:
    """A header's value, decoded from MCP's `=?base64?...?=` form when it is in it; None
    when it is missing or does not decode."""
    value = request.headers.get(name)
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _discovered() -> dict[str, Any]:
    return {
        "supportedVersions": [*MODERN_VERSIONS, *VERSIONS],
        "capabilities": CAPABILITIES,
        "instructions": INSTRUCTIONS,
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {SERVER_INFO_META: SERVER_INFO},
    }


def _stamped(result: dict[str, Any], method: str, modern: bool) -> dict[str, Any]:
    """A result as its era has it: in 2026-07-28 every result says it is complete, and
    what a client may cache says for how long (not at all: tools change per caller)."""
    if not modern:
        return result
    stamped = {**result, "resultType": "complete"}
    if method in CACHEABLE:
        stamped.update(ttlMs=0, cacheScope="private")
    return stamped


def _check_headers(request: Request, config: McpConfig, *, post: bool) -> None:
    if not _origin_allowed(request, config):
        raise McpRefusal(403, JsonRpcError(INVALID_REQUEST, "Origin not allowed"))
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version not in VERSIONS and version not in MODERN_VERSIONS:
        supported = ", ".join((*MODERN_VERSIONS, *VERSIONS))
        rpc = JsonRpcError(
            INVALID_REQUEST, f"Unsupported MCP-Protocol-Version (supported: {supported})"
        )
        raise McpRefusal(400, rpc)
    if post:
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        if kind.lower() != "application/json":
            raise McpRefusal(
                415, JsonRpcError(INVALID_REQUEST, "Content-Type must be application/json")
            )


def _message(body: bytes) -> Message:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise McpRefusal(400, JsonRpcError(PARSE_ERROR, f"Parse error: {exc}")) from None
    if isinstance(value, dict | list) and len(body) > 256 and too_deep(value):
        raise McpRefusal(400, JsonRpcError(INVALID_REQUEST, "the message nests past 128 levels"))
    try:
        return parse_message(value)
    except JsonRpcError as rpc:
        raise McpRefusal(400, rpc) from None


def _caller(identity: Identity, record: RequestRecord) -> Caller:
    settings = identity.tenant.mcp
    access = McpAccess(tuple(settings.tools), identity.key_mcp_tools)
    outbound = identity.tenant.outbound.policy
    return Caller(identity.name, identity.key_id, access, record.request_id, outbound)


async def _initialize(mcp: McpGateway, identity: Identity, message: Message) -> Response:
    asked = message.params.get("protocolVersion")
    version = asked if isinstance(asked, str) and asked in VERSIONS else VERSIONS[0]
    info = message.params.get("clientInfo")
    client = ""
    if isinstance(info, dict):
        client = f"{str(info.get('name', ''))[:100]} {str(info.get('version', ''))[:50]}".strip()
    try:
        session = await mcp.sessions.create(identity.name, identity.key_id, version, client)
    except TooManySessions:
        most = mcp.config.max_sessions_per_tenant
        rpc = JsonRpcError(RATE_LIMITED, f"At most {most} live sessions: end one (DELETE)")
        raise McpRefusal(429, rpc, {"Retry-After": "60"}) from None
    metrics.MCP_SESSIONS_STARTED.inc()
    result = {
        "protocolVersion": version,
        "capabilities": CAPABILITIES,
        "serverInfo": SERVER_INFO,
        "instructions": INSTRUCTIONS,
    }
    assert message.id is not None
    response = _json(result_message(message.id, result))
    response.headers["Mcp-Session-Id"] = session.id
    return response


async def _session(mcp: McpGateway, request: Request, identity: Identity) -> ClientSession:
    session_id = request.headers.get(SESSION_HEADER)
    if session_id is None:
        rpc = JsonRpcError(INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required")
        raise McpRefusal(400, rpc)
    session = await mcp.sessions.find(session_id, identity.name, identity.key_id)
    if session is None:
        # Unknown, ended, expired, or another key's: the client initializes again.
        raise McpRefusal(404, JsonRpcError(INVALID_REQUEST, "Session not found"))
    return session


async def _serve(service: McpService, caller: Caller, message: Message) -> dict[str, Any]:
    method, params = message.method, message.params
    if method == "ping" or method == "logging/setLevel":
        return {}
    if method == "tools/list":
        return {"tools": await service.list_tools(caller)}
    if method == "prompts/list":
        return {"prompts": await service.list_prompts(caller)}
    if method == "resources/list":
        return {"resources": await service.list_resources(caller, templates=False)}
    if method == "resources/templates/list":
        return {"resourceTemplates": await service.list_resources(caller, templates=True)}
    if method == "resources/read":
        return await service.read_resource(caller, params.get("uri"))
    if method == "prompts/get":
        return await service.get_prompt(caller, params.get("name"), params.get("arguments"))
    raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")


async def _call_tool(
    mcp: McpGateway,
    identity: Identity,
    message: Message,
    record: RequestRecord,
    count: CountRequest,
    log_prompts: bool,
    modern: bool,
) -> Response:
    assert message.id is not None
    name = message.params.get("name")
    if not isinstance(name, str):
        await count("")
        return _json(error_message(message.id, JsonRpcError(INVALID_PARAMS, "name is a string")))
    record.alias = name[:128]
    parts = split_name(name)
    server = parts[0] if parts is not None and parts[0] in mcp.service.servers else "-"
    if server != "-":
        record.model = record.served_model = server
    # The tool's own rate, where its tenant has one, on the same call as the tenant's
    # and the key's (any other name counts as any request).
    tool = "/".join(parts) if parts is not None else ""
    limited = tool in identity.tenant.mcp.limits
    try:
        await count(MCP_TOOL_PREFIX + tool if limited else "")
    except RateLimited:
        record.outcome = "rate_limited"
        metrics.MCP_CALLS.labels(server, "-", "rate_limited").inc()
        raise
    stats = CallStats()
    caller = _caller(identity, record)
    try:
        result = await mcp.service.call_tool(caller, name, message.params.get("arguments"), stats)
    except JsonRpcError as rpc:
        return _json(error_message(message.id, JsonRpcError(rpc.code, redact(rpc.message))))
    except SensitiveDataBlocked as blocked:
        found = ", ".join(blocked.categories)
        refusal = JsonRpcError(BLOCKED, f"Blocked: data kept from {stats.server} ({found})")
        return _json(error_message(message.id, refusal))
    finally:
        record.bytes_in, record.bytes_out = stats.bytes_in, stats.bytes_out
        record.outcome = stats.outcome
        metrics.MCP_CALLS.labels(stats.server, stats.tool, stats.outcome).inc()
    if log_prompts:
        # As a prompt is: only when the operator asked, redacted as every line is.
        shown = {"arguments": message.params.get("arguments"), "result": result}
        record.prompt = orjson.dumps(shown).decode()[:LOGGED_CHARS]
    return _json(result_message(message.id, _stamped(result, "tools/call", modern)))


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def get(request: Request) -> Response:
    """The session's stream: its tenant's list-changed notifications, from where the
    client left off (`Last-Event-ID`) or from now."""
    return await _served(request, _get)


async def _get(
    request: Request,
    identity: Identity,
    record: RequestRecord,
    count: CountRequest,
    exchange: _Exchange,
) -> Response:
    record.alias = "GET"  # the ledger's name for a stream
    mcp = gateway_of(request)
    _check_headers(request, mcp.config, post=False)
    if "text/event-stream" not in request.headers.get("accept", ""):
        raise McpRefusal(
            406, JsonRpcError(INVALID_REQUEST, "Accept must include text/event-stream")
        )
    session = await _session(mcp, request, identity)
    await count("")
    tenant = identity.name
    after = request.headers.get("last-event-id")
    if after is None:
        after = await mcp.sessions.last_event_id(tenant)
    # Counted here, with no wait between the look and the count: streams opened at once
    # cannot all pass the look before any is counted.
    if mcp.streams.get(tenant, 0) >= MAX_STREAMS_PER_TENANT:
        rpc = JsonRpcError(RATE_LIMITED, f"At most {MAX_STREAMS_PER_TENANT} open streams")
        raise McpRefusal(429, rpc, {"Retry-After": "5"})
    mcp.streams[tenant] = mcp.streams.get(tenant, 0) + 1
    events = _events(mcp, _caller(identity, record), session, after)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _events(
    mcp: McpGateway, caller: Caller, session: ClientSession, after: str
) -> AsyncIterator[bytes]:
    """The stream's events (its slot in `mcp.streams` taken by the caller, given back
    here); it ends when its session does, or Redis cannot be read (the client comes
    back with its `Last-Event-ID`)."""
    tenant = caller.tenant
    try:
        yield b": stream open\n\n"
        quiet = 0.0
        while not mcp.closing.is_set():
            try:
                events = await mcp.sessions.events_after(tenant, after)
                alive = await mcp.sessions.find(session.id, session.tenant, session.key_id)
            except REDIS_ERRORS:
                return
            if alive is None:
                return  # ended (DELETE) or expired
            for event in events:
                after = event.id
                if not caller.access.sees_server(event.server) or event.kind not in NOTIFICATIONS:
                    continue
                data = orjson.dumps({"jsonrpc": "2.0", "method": NOTIFICATIONS[event.kind]})
                yield b"id: " + event.id.encode() + b"\ndata: " + data + b"\n\n"
                quiet = 0.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(mcp.closing.wait(), EVENTS_POLL_S)
            quiet += EVENTS_POLL_S
            if quiet >= KEEPALIVE_S:
                yield b": keep-alive\n\n"
                quiet = 0.0
    finally:
        mcp.streams[tenant] -= 1


async def delete(request: Request) -> Response:
    """The session is over."""
    return await _served(request, _delete)


async def _delete(
    request: Request,
    identity: Identity,
    record: RequestRecord,
    count: CountRequest,
    exchange: _Exchange,
) -> Response:
    record.alias = "DELETE"
    mcp = gateway_of(request)
    _check_headers(request, mcp.config, post=False)
    session = await _session(mcp, request, identity)
    await count("")
    await mcp.sessions.end(session)
    return Response(status_code=200)
