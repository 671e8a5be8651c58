"""Connections to upstream MCP servers: Streamable HTTP (aiohttp) and stdio (a process in
the sandbox), each opened with the `initialize` handshake.

The transports are the gateway's own, over aiohttp and asyncio's pipes, rather than the
`mcp` SDK's client: the SDK reads a whole message before any cap applies, and the
gateway must stop reading at `max_result_bytes`, at a deadline, and at a flood
(docs/design/mcp-gateway.md, "The upstream client"). The SDK is the tests' client and
their servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from gateway.backends.http import new_session, sse_payloads
from gateway.config.schema import McpServer
from gateway.mcp.stdio_sandbox import SandboxUnavailable, for_tenant, sandboxed
from gateway.mcp.upstream_peer import (
    CLIENT_INFO,
    UPSTREAM_PROTOCOL_VERSION,
    NotificationSink,
    UpstreamFailure,
    UpstreamPeer,
    result_of,
)
from gateway.observability.logging import redact

log = logging.getLogger("gateway.mcp")

# Room for a message's envelope around a result of `max_result_bytes`.
ENVELOPE_BYTES = 64 * 1024
# What is kept of a stdio server's standard error, for the log; and what it may write
# there a second (past it, it is read no faster: it waits on its own writes).
STDERR_KEPT = 2048
STDERR_PER_S = 64 * 1024
# How long a cancellation may take to be written to a stdio server, or posted to a
# remote one.
CANCEL_WRITE_S = 1.0
CANCEL_POST_S = 2.0
# What may wait to be written to a stdio server that does not read it: past it, the
# server is ended (its calls told), not the gateway's memory filled.
UNREAD_BYTES = 8 * 1024 * 1024
ACCEPT = "application/json, text/event-stream"


class Connection(Protocol):
    """One open connection to an upstream server, its handshake done."""

    server_name: str
    initialize_result: dict[str, Any]

    @property
    def closed(self) -> bool: ...

    async def call(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The result of `method`, or `UpstreamFailure`."""
        ...

    async def close(self) -> None: ...


async def open_connection(
    name: str, server: McpServer, on_notification: NotificationSink, tenant: str
) -> Connection:
    """`tenant`'s connection to `server`, its handshake done within `start_timeout_s`;
    `UpstreamFailure` (`unavailable`) when it cannot be made."""
    connection: StdioConnection | HttpConnection
    if server.command is not None:
        connection = StdioConnection(name, for_tenant(server, tenant), on_notification)
    else:
        connection = HttpConnection(name, server, on_notification)
    try:
        async with asyncio.timeout(server.start_timeout_s):
            await connection.start()
    except TimeoutError:
        await connection.close()
        raise UpstreamFailure(
            "unavailable", f"MCP server {name} did not start in {server.start_timeout_s:g} s"
        ) from None
    except UpstreamFailure as failure:
        await connection.close()
        raise UpstreamFailure(
            "unavailable", f"MCP server {name} did not start: {failure.message}"
        ) from None
    except SandboxUnavailable as missing:
        await connection.close()
        log.warning("MCP server %s not started: %s", name, missing)
        raise UpstreamFailure("unavailable", f"MCP server {name} cannot run here") from None
    except BaseException:
        await connection.close()
        raise
    return connection


def _too_large(name: str, limit: int) -> UpstreamFailure:
    return UpstreamFailure("too_large", f"MCP server {name} sent a message over {limit} bytes")


def _timed_out(name: str, timeout_s: float | None) -> UpstreamFailure:
    return UpstreamFailure("timeout", f"MCP server {name} did not answer in {timeout_s:g} s")


def _cancelled(request_id: int, reason: str) -> dict[str, Any]:
    """The notification that tells a server the gateway stopped waiting for a request."""
    params = {"requestId": request_id, "reason": reason}
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


def _decoded(raw: bytes) -> Any:
    """A line or event a server sent, parsed; None when it is not JSON (paid for by the
    server all the same: `UpstreamPeer.received`)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _initialize_params() -> dict[str, Any]:
    return {
        "protocolVersion": UPSTREAM_PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": CLIENT_INFO,
    }


@dataclass(frozen=True, slots=True)
class _Child:
    """A stdio server's process and its pipes, as streams."""

    popen: subprocess.Popen[bytes]
    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader


async def _spawn(argv: list[str], env_fd: int, limit: int) -> _Child:
    """`argv` started with nothing of the gateway's but its pipes and `env_fd`.

    `subprocess.Popen` and not asyncio's subprocess: Popen closes every other descriptor
    in the child, where uvloop's subprocess passes each inheritable one on, the gateway's
    listening sockets among them (a sandboxed server could then accept another tenant's
    connection, key and all)."""
    loop = asyncio.get_running_loop()
    popen = await asyncio.to_thread(
        subprocess.Popen,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(env_fd,),
        close_fds=True,
        env={},  # bwrap starts with nothing of the gateway's environment
    )
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    stdout = asyncio.StreamReader(limit=limit, loop=loop)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stdout, loop=loop), popen.stdout
    )
    stderr = asyncio.StreamReader(loop=loop)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stderr, loop=loop), popen.stderr
    )
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), popen.stdin
    )
    stdin = asyncio.StreamWriter(transport, protocol, None, loop)
    return _Child(popen, stdin, stdout, stderr)


class StdioConnection:
    """A stdio server: one sandboxed process, newline-delimited JSON-RPC on its pipes."""

    def __init__(self, name: str, server: McpServer, on_notification: NotificationSink) -> None:
        self.server_name = name
        self._server = server
        self._peer = UpstreamPeer(name, on_notification)
        self._process: _Child | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        self._stderr = b""
        self._secrets: list[str] = []
        self.initialize_result: dict[str, Any] = {}

    @property
    def closed(self) -> bool:
        return self._peer.closed

    async def start(self) -> None:
        server = self._server
        assert server.command is not None
        env = dict(server.env)
        env.update({name: os.environ.get(var, "") for name, var in server.env_from.items()})
        self._secrets = [os.environ[v] for v in server.env_from.values() if os.environ.get(v)]
        command = sandboxed(server.command, server.sandbox, env, server.cwd)
        try:
            self._process = await _spawn(
                command.argv, command.env_fd, server.max_result_bytes + ENVELOPE_BYTES
            )
        finally:
            os.close(command.env_fd)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._read_stderr())]
        result = await self._request("initialize", _initialize_params(), None)
        self.initialize_result = result
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def call(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        return await self._request(method, params, timeout_s)

    async def _request(
        self, method: str, params: dict[str, Any], timeout_s: float | None
    ) -> dict[str, Any]:
        peer = self._peer
        if peer.closed:
            raise peer.failure or UpstreamFailure(
                "unavailable", f"MCP server {self.server_name} is closed"
            )
        request_id = peer.next_id()
        answer = peer.expect(request_id)
        sent = False
        try:
            # The write too is under the deadline: a server that stops reading its input
            # would otherwise hold every call (and its bytes) in the gateway.
            async with asyncio.timeout(timeout_s):
                await self._send(
                    {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
                )
                sent = True
                response = await answer
        except TimeoutError:
            if sent and not self._unread():
                await self._cancel(request_id, "the gateway's timeout")
            else:
                # Our request is not read yet: the server stopped reading. Its process
                # ends, and with it what waited to be written to it.
                self._end("it stopped reading its input")
                await self._stop_process()
            raise _timed_out(self.server_name, timeout_s) from None
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel(request_id, "the client left"))
            raise
        finally:
            peer.forget(request_id)
        return result_of(self.server_name, response)

    async def _cancel(self, request_id: int, reason: str) -> None:
        with contextlib.suppress(UpstreamFailure, TimeoutError):
            async with asyncio.timeout(CANCEL_WRITE_S):
                await self._send(_cancelled(request_id, reason))

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or self._peer.closed:
            raise self._peer.failure or UpstreamFailure("unavailable", "not running")
        async with self._write_lock:
            try:
                process.stdin.write(orjson.dumps(message) + b"\n")
                if self._unread() > UNREAD_BYTES:
                    self._end("it stopped reading its input")
                    raise ConnectionError("unread")
                await process.stdin.drain()
            except (ConnectionError, RuntimeError) as exc:
                self._end(f"its input closed ({type(exc).__name__})")
                raise self._peer.failure or UpstreamFailure("unavailable", "gone") from None

    def _unread(self) -> int:
        """Bytes written to the server that it has not read yet (the pipe's buffer)."""
        process = self._process
        return 0 if process is None else process.stdin.transport.get_write_buffer_size()

    async def _read(self) -> None:
        assert self._process is not None
        stdout = self._process.stdout
        peer = self._peer
        limit = self._server.max_result_bytes
        while not peer.closed:
            try:
                line = await stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                # Past the cap, the stream cannot be read on without the whole line: the
                # process is ended, its calls told why (they cannot be told apart).
                peer.cut_off(_too_large(self.server_name, limit))
                break
            if not line:
                self._end("it exited")
                break
            peer.received(_decoded(line), self._send)
        await self._stop_process()

    async def _read_stderr(self) -> None:
        assert self._process is not None
        stderr = self._process.stderr
        with contextlib.suppress(ValueError, asyncio.LimitOverrunError, ConnectionError):
            while chunk := await stderr.read(65536):
                # Its last words only: what says why it did not start.
                self._stderr = (self._stderr + chunk)[-STDERR_KEPT:]
                # A server that writes without end is read at this pace, no faster.
                await asyncio.sleep(len(chunk) / STDERR_PER_S)

    def _end(self, why: str) -> None:
        # Its last words go to the log only, redacted and without the credentials it was
        # given: a server may print what it was started with.
        last = self._stderr.decode(errors="replace").strip().splitlines()[-1:]
        if last:
            said = last[0][:300]
            for secret in self._secrets:
                said = said.replace(secret, "[credential]")
            name = self.server_name
            log.warning("MCP server %s: %s; its last words: %s", name, why, redact(said))
        failure = UpstreamFailure("unavailable", f"MCP server {self.server_name}: {why}")
        self._peer.cut_off(failure)

    async def _stop_process(self) -> None:
        process = self._process
        if process is None:
            return
        process.stdin.close()
        if process.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.popen.kill()  # bwrap's end ends its PID namespace: all of it
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(process.popen.wait, 5)

    async def close(self) -> None:
        if not self._peer.closed:
            failure = UpstreamFailure("unavailable", f"MCP server {self.server_name} closed")
            self._peer.cut_off(failure, quiet=True)
        await self._stop_process()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class HttpConnection:
    """A remote server over Streamable HTTP: one POST per message, its answer JSON or an
    event stream; the server's session id and protocol version on every request after
    the handshake. Its credentials (from the environment) go on every request."""

    def __init__(self, name: str, server: McpServer, on_notification: NotificationSink) -> None:
        assert server.url is not None
        self.server_name = name
        self._server = server
        self._url = server.url
        self._peer = UpstreamPeer(name, on_notification)
        headers = dict(server.headers)
        headers.update({h: os.environ.get(var, "") for h, var in server.env_headers.items()})
        if server.bearer_token_env is not None:
            headers["Authorization"] = "Bearer " + os.environ.get(server.bearer_token_env, "")
        self._session = new_session(server.start_timeout_s, None, headers)
        self._session_id: str | None = None
        self._version: str | None = None
        self._listener: asyncio.Task[None] | None = None
        self.initialize_result: dict[str, Any] = {}

    @property
    def closed(self) -> bool:
        return self._peer.closed

    async def start(self) -> None:
        response = await self._post_request("initialize", _initialize_params(), None)
        result = result_of(self.server_name, response)
        self.initialize_result = result
        version = result.get("protocolVersion")
        self._version = version if isinstance(version, str) else UPSTREAM_PROTOCOL_VERSION
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, None)
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def call(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._peer.closed:
            raise self._peer.failure or UpstreamFailure("unavailable", "closed")
        response = await self._post_request(method, params, timeout_s)
        return result_of(self.server_name, response)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if self._session_id is not None:
            headers["Mcp-Session-Id"] = self._session_id
        if self._version is not None:
            headers["MCP-Protocol-Version"] = self._version
        return headers

    async def _post_request(
        self, method: str, params: dict[str, Any], timeout_s: float | None
    ) -> dict[str, Any]:
        request_id = self._peer.next_id()
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._post(message, request_id)
        except TimeoutError:
            await self._cancel(request_id)
            raise _timed_out(self.server_name, timeout_s) from None
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel(request_id))
            raise
        if response is None:
            raise UpstreamFailure("malformed", f"MCP server {self.server_name} sent no response")
        return response

    async def _cancel(self, request_id: int) -> None:
        with contextlib.suppress(UpstreamFailure, TimeoutError):
            async with asyncio.timeout(CANCEL_POST_S):
                await self._post(_cancelled(request_id, "the gateway's timeout"), None)

    async def _post(self, message: dict[str, Any], request_id: int | None) -> dict[str, Any] | None:
        limit = self._server.max_result_bytes
        try:
            async with self._session.post(
                self._url,
                data=orjson.dumps(message),
                headers=self._headers(),
                read_bufsize=limit + ENVELOPE_BYTES,
                allow_redirects=False,
            ) as response:
                if response.status == 404 and self._session_id is not None:
                    self._peer.cut_off(UpstreamFailure("unavailable", "its session ended"))
                    raise self._peer.failure or UpstreamFailure("unavailable", "session ended")
                if response.status >= 400:
                    raise UpstreamFailure(
                        "unavailable",
                        f"MCP server {self.server_name} answered HTTP {response.status}",
                    )
                session_id = response.headers.get("Mcp-Session-Id")
                if session_id and self._session_id is None:
                    self._session_id = session_id[:256]
                if request_id is None:
                    return None
                kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if kind == "text/event-stream":
                    return await self._from_stream(response, request_id)
                return await self._from_json(response, request_id)
        except aiohttp.ClientError as exc:
            if isinstance(exc, aiohttp.http_exceptions.LineTooLong):
                raise _too_large(self.server_name, limit) from None
            raise UpstreamFailure(
                "unavailable", f"MCP server {self.server_name} unreachable ({type(exc).__name__})"
            ) from None

    async def _from_json(self, response: aiohttp.ClientResponse, request_id: int) -> dict[str, Any]:
        limit = self._server.max_result_bytes + ENVELOPE_BYTES
        body = bytearray()
        while chunk := await response.content.read(65536):
            body += chunk
            if len(body) > limit:
                raise _too_large(self.server_name, self._server.max_result_bytes)
        message = _decoded(bytes(body))
        if message is None:
            raise UpstreamFailure("malformed", f"MCP server {self.server_name} sent no JSON")
        if isinstance(message, dict) and message.get("id") == request_id:
            return message
        raise UpstreamFailure(
            "malformed", f"MCP server {self.server_name} answered another request"
        )

    async def _from_stream(
        self, response: aiohttp.ClientResponse, request_id: int
    ) -> dict[str, Any]:
        limit = self._server.max_result_bytes + ENVELOPE_BYTES
        async for payload in sse_payloads(response):
            if len(payload) > limit:
                raise _too_large(self.server_name, self._server.max_result_bytes)
            message = _decoded(payload)
            if (
                isinstance(message, dict)
                and "method" not in message
                and message.get("id") == request_id
            ):
                return message
            self._peer.received(message, self._reply)
            if self._peer.closed:
                raise self._peer.failure or UpstreamFailure("unavailable", "cut off")
        raise UpstreamFailure(
            "malformed", f"MCP server {self.server_name} ended its stream unanswered"
        )

    async def _reply(self, message: dict[str, Any]) -> None:
        await self._post(message, None)

    async def _listen(self) -> None:
        """The server's own stream (GET), for its list-changed notifications; none if
        it offers none (405), given up after a few failures."""
        failures = 0
        while not self._peer.closed and failures < 3:
            try:
                async with self._session.get(
                    self._url,
                    headers={k: v for k, v in self._headers().items() if k != "Content-Type"}
                    | {"Accept": "text/event-stream"},
                    read_bufsize=self._server.max_result_bytes + ENVELOPE_BYTES,
                    allow_redirects=False,  # its credentials go to its own URL only
                ) as response:
                    if response.status != 200:
                        return
                    failures = 0
                    async for payload in sse_payloads(response):
                        self._peer.received(_decoded(payload), self._reply)
                        if self._peer.closed:
                            return
            except (aiohttp.ClientError, UpstreamFailure):
                failures += 1
                await asyncio.sleep(1.0 * failures)

    async def close(self) -> None:
        if not self._peer.closed:
            failure = UpstreamFailure("unavailable", f"MCP server {self.server_name} closed")
            self._peer.cut_off(failure, quiet=True)
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        if self._session_id is not None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with (
                    asyncio.timeout(2),
                    self._session.delete(self._url, headers=self._headers()),
                ):
                    pass  # the server may end the session (or answer 405)
        await self._session.close()
