"""The inference endpoints over HTTP: what HTTP carries in, the wire's answer out.

One function serves every inference API (`serve`, given the API's `Wire`): it opens the
request's record, hands the conductor (`gateway.serving.conductor`, which alone knows
the order of the steps) an `Incoming`: what HTTP carried (the key, the headers that ask
for a priority, a timeout, idempotency or a session) and the wire's steps (read and
decode the body, parse it, render a whole answer, the client's error). What comes back,
a rendered answer or an open stream, it writes out. Every refusal, whatever raised it,
is turned into the client's error by `api/errors.client_error`.

Every request that arrives is answered (or its client is gone) and ends in one
`RequestRecord`: counted and logged once, whatever ended it. While a request is queued
or waits for the upstream, a `DisconnectWatch` notices its client leaving and cancels it
(queue place, slot and upstream call go at once; logged 499).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.api import errors
from gateway.api.anthropic import MESSAGES
from gateway.api.body import decode_json, requested_model
from gateway.api.endpoints import conductor_of, runtime_of
from gateway.api.errors import APIError
from gateway.api.openai import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.api.openai.openai_choices import choice_events
from gateway.api.responses import RESPONSES
from gateway.api.sessions import with_session
from gateway.api.tool_lists import as_json
from gateway.api.wire import Wire
from gateway.inference.ids import random_id
from gateway.inference.types import InferenceRequest
from gateway.observability import metrics, tracing
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity
from gateway.serving.conductor import Answer, Plan, Stream
from gateway.serving.idempotency import Reply
from gateway.serving.runtime import Runtime
from gateway.storage.idempotency_store import fingerprint
from gateway.transport.streaming import (
    ClientGone,
    DisconnectWatch,
    EventStreamResponse,
    StreamCut,
)
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def chat_completions(request: Request) -> Response:
    return await serve(request, CHAT)


async def completions(request: Request) -> Response:
    return await serve(request, COMPLETIONS)


async def embeddings(request: Request) -> Response:
    return await serve(request, EMBEDDINGS)


async def responses(request: Request) -> Response:
    return await serve(request, RESPONSES)


async def messages(request: Request) -> Response:
    return await serve(request, MESSAGES)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise errors.body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise errors.body_too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None  # left while sending its body: 499, not a 500
    return b"".join(chunks)


async def serve(request: Request, wire: Wire) -> Response:
    """Serve one request of `wire`'s API, start to end."""
    # Counted and logged from the start, whatever happens: tenant and model are "-" until
    # known (a model only once it is a configured one).
    runtime = runtime_of(request)
    record = RequestRecord(
        wire.id_prefix + random_id(), endpoint=wire.name, sink=runtime.record_sink
    )
    if tracing.enabled():
        record.trace = tracing.begin_request(wire.operation, request.scope["headers"])
    incoming = _HttpIncoming(request, wire, runtime, record)
    try:
        outcome = await conductor_of(request).conduct(incoming)
        if isinstance(outcome, Stream):
            return _stream(incoming, outcome)
        return Response(
            outcome.body,
            outcome.status,
            # A replay's too: only the gateway's own headers are stored with an answer.
            headers=_with_wire_headers(wire, outcome.headers),
            media_type="application/json",
            background=BackgroundTask(_answered, record, outcome.status),
        )
    except errors.CLIENT_ERRORS as exc:
        error = errors.client_error(exc)
        record.finish(error.status, error.reason)
        error.headers["x-request-id"] = record.request_id
        if wire.render_error is not None:
            return wire.render_error(error)
        if error is exc:
            raise
        raise error from exc
    except ClientGone:
        # 499, as nginx logs it. Nobody reads the response; the server needs one.
        record.finish(499)
        return Response(status_code=499)
    except asyncio.CancelledError:
        record.finish(499)
        raise
    except Exception as exc:
        record.finish(500)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        failed = _unhandled(record)
        if wire.render_error is not None:
            return wire.render_error(failed)
        raise failed from exc


def refusal_of(exc: Exception, record: RequestRecord, where: str) -> APIError:
    """What a client is told of a refusal before admission (`Incoming.refusal`): a
    context too long, a missing capability... as such; anything else is the gateway's own
    fault, a 500 (logged with `where`), counted as a 4xx is, so that no request shape is
    free to repeat (nor its traceback to log)."""
    if isinstance(exc, errors.CLIENT_ERRORS):
        return errors.client_error(exc)
    log.error("unhandled error on %s", where, exc_info=exc)
    return _unhandled(record)


def _unhandled(record: RequestRecord) -> APIError:
    return APIError(
        500,
        "The gateway failed to handle the request.",
        type="server_error",
        headers={"x-request-id": record.request_id},
    )


class _HttpIncoming:
    """A request as the conductor sees it (`serving.conductor.Incoming`): the headers
    read, the body read and parsed by the wire, answers written by it."""

    # A client's own request, never a batch's line.
    batch_id = None

    __slots__ = (
        "credentials",
        "idempotency_key",
        "priority",
        "record",
        "request",
        "runtime",
        "timeout",
        "watch",
        "wire",
    )  # fmt: skip

    def __init__(self, request: Request, wire: Wire, runtime: Runtime, record: RequestRecord):
        headers = request.headers
        self.request, self.wire, self.runtime, self.record = request, wire, runtime, record
        self.credentials = wire.credentials(headers)
        self.priority = headers.get("x-priority")
        self.timeout = headers.get("x-request-timeout")
        self.idempotency_key = headers.get("idempotency-key")
        self.watch: DisconnectWatch | None = None

    async def read(self, limit: int) -> tuple[Mapping[str, Any], int]:
        body = await read_body(self.request, limit)
        return decode_json(body), len(body)

    def requested_model(self, data: Mapping[str, Any]) -> str:
        return requested_model(data)

    async def parse(
        self, identity: Identity, route: ModelRoute, data: Mapping[str, Any], size: int
    ) -> InferenceRequest:
        return await parsed(
            self.wire, self.runtime, identity, route, data, size, self.request.headers
        )

    def fingerprint(self, data: Mapping[str, Any]) -> str:
        return fingerprint(self.request.url.path, as_json(data))

    def client(self) -> DisconnectWatch:
        self.watch = DisconnectWatch(self.request.receive)
        return self.watch

    async def render(self, answer: Answer, identity: Identity) -> Reply:
        return await rendered(self.wire, self.runtime, self.record, answer, identity)

    def refusal(self, exc: Exception) -> APIError:
        request = self.request
        return refusal_of(exc, self.record, f"{request.method} {request.url.path}")


async def parsed(
    wire: Wire,
    runtime: Runtime,
    identity: Identity,
    route: ModelRoute,
    data: Mapping[str, Any],
    size: int,
    headers: Mapping[str, str],
) -> InferenceRequest:
    """The wire's parse of a body for `route`'s model (a stored conversation continued
    first, where the wire has them), with its session key for cache-aware routing."""
    parse = wire.parse
    if wire.prepare is not None:  # a stored conversation to continue
        parse = await wire.prepare(runtime, identity, data, size)
    inference = parse(data, route.config.max_tokens_default)
    return with_session(inference, headers, data, route.config.routing)


async def rendered(
    wire: Wire, runtime: Runtime, record: RequestRecord, answer: Answer, identity: Identity
) -> Reply:
    """A whole answer in the wire's format (kept, where the wire keeps answers)."""
    body = wire.body(
        answer.parts, answer.completions, response_id=record.request_id, model=answer.model
    )
    headers = answer.headers
    if wire.keep is not None:
        headers.update(await wire.keep(runtime, identity, answer.parts[0], body))
    return Reply(200, body, headers)


def _with_wire_headers(wire: Wire, headers: dict[str, str]) -> dict[str, str]:
    if wire.more_headers is not None:
        headers.update(wire.more_headers(headers))
    return headers


async def _answered(record: RequestRecord, status: int) -> None:
    # Run once the answer is sent: its metrics and log line cost the client no time.
    record.finish(status)


def _stream(incoming: _HttpIncoming, stream: Stream) -> Response:
    wire, runtime, plan = incoming.wire, incoming.runtime, stream.plan
    watch = incoming.watch
    assert watch is not None  # the conductor watched the client while it opened
    # From here the relay watches the client (no more cancelling this task).
    watch.on_gone = None
    headers = {**_SSE_HEADERS, **_with_wire_headers(wire, stream.headers)}
    end = _StreamEnd(stream, stream.served.route.name)
    if len(stream.opened) == 1:
        events = _sse_events(wire, runtime, plan, stream, end)
    else:
        events = choice_events(plan, stream, end.ended)
    server = runtime.config.gateway.server
    ping = wire.ping
    return EventStreamResponse(
        events,
        stall_timeout_s=server.stream_stall_timeout_s,
        headers=headers,
        on_cut=end.cut_short,
        on_close=end,
        watch=watch,
        keepalive=None if ping is None else (server.stream_ping_interval_s, ping),
    )


@dataclass(slots=True)
class _StreamEnd:
    """What ends a stream, run once: by the events generator when it ends, or by the
    response when the generator never started (its `finally` would not run then)."""

    stream: Stream
    model: str
    # 499, as nginx logs it, unless the stream ran to its end or its error event.
    status: int = 499
    # Why the client stopped reading or left, if it did.
    cut: StreamCut | None = field(default=None)
    # Why the gateway ended it with an error event, if it did (`deadline`, ...).
    reason: str | None = None

    def cut_short(self, reason: StreamCut) -> None:
        """The client stopped reading or left: the stream ends here."""
        self.cut = reason
        metrics.labels(metrics.STREAMS_CUT, self.model, reason.value).inc()

    async def __call__(self) -> None:
        await self.stream.close(499 if self.cut is not None else self.status, self.reason)

    async def ended(self, status: int, reason: str | None = None) -> None:
        """The events ended with `status` (200: to their end; 499: not), for `reason`
        when the gateway ended them with an error event."""
        self.status = status
        if reason is not None:
            self.reason = reason
        await self()


async def _sse_events(
    wire: Wire, runtime: Runtime, plan: Plan, stream: Stream, end: _StreamEnd
) -> AsyncGenerator[bytes, None]:
    """The events of a stream of one part, in the wire's format."""
    request = plan.parts[0]
    first, deltas, served = stream.opened[0]
    record = plan.ask.record
    prompt_estimate = stream.works[0].first_call.prompt_estimate
    writer = wire.stream_writer(request, record.request_id, served.route.name, prompt_estimate)
    # 499 until the stream has run to its end or to its error event.
    status = 499
    try:
        called = False
        # Kept only to check it against `response_format` at the end.
        checked = request.options.response_format is not None
        text: list[str] = []
        opening = writer.start()
        if opening:
            yield opening
        # The first piece and the rest are handled alike, written out twice: a shared
        # helper would cost every streamed chunk a call on the hot path.
        if request.echo:
            yield writer.text(request.prompt)
        if first is not None:
            stream.add(first)
            if first.text:
                if checked:
                    text.append(first.text)
                yield writer.text(first.text, first.logprobs)
            if first.tool_calls:
                called = True
                yield writer.tool_calls(first.tool_calls)
            async for delta in deltas:
                stream.add(delta)
                if delta.text:
                    if checked:
                        text.append(delta.text)
                    yield writer.text(delta.text, delta.logprobs)
                if delta.tool_calls:
                    called = True
                    yield writer.tool_calls(delta.tool_calls)
        finish = stream.finish_reason(0, called)
        if record.trace is not None:
            record.finish_reasons = (finish,)
        try:
            stream.check(0, "".join(text), called, finish)
        except errors.CLIENT_ERRORS as exc:
            # The text has gone out; the stream ends with an error instead of its finish.
            invalid = errors.client_error(exc)
            status = invalid.status
            yield writer.error(invalid)
            return
        yield writer.close(finish, stream.usage())
        status = 200
        answer = writer.answer()
        if answer is not None and wire.keep is not None:
            await wire.keep(runtime, plan.ask.identity, request, answer)
    except Exception as exc:
        # Headers are gone: the failure becomes a terminal error event.
        failed = errors.stream_failure(served.route.name, exc)
        status, end.reason = failed.status, failed.reason
        yield writer.error(failed)
    finally:
        await end.ended(status)
