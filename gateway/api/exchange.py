"""The inference endpoints over HTTP: a request's body in, its wire's answer out.

    key -> body -> authorize (conductor) -> the wire's parse -> plan (conductor)
    -> Idempotency-Key -> answer or stream (conductor) -> the wire's JSON or events

One function serves every inference API (`serve`, given the API's `Wire`): it reads
what HTTP carries (the key, the body, the headers that ask for a priority, a timeout or
a session), hands the parsed request to the conductor (`gateway.serving.conductor`,
which alone knows the order of the steps between), and writes what comes back in the
wire's format. Every refusal, whatever raised it, is turned into the client's error by
`api/errors.client_error`.

Every request that arrives is answered (or its client is gone) and ends in one
`RequestRecord`: counted and logged once, whatever ended it. While a request is queued
or waits for the upstream, a `DisconnectWatch` notices its client leaving and cancels it
(queue place, slot and upstream call go at once; logged 499).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field

from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.api import errors
from gateway.api.anthropic import MESSAGES
from gateway.api.body import decode_json, requested_model
from gateway.api.endpoints import conductor_of, runtime_of
from gateway.api.errors import APIError
from gateway.api.idempotency import claim
from gateway.api.openai import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.api.openai.openai_answers import SSE_DONE, ChunkWriter, sse_error
from gateway.api.responses import RESPONSES
from gateway.api.sessions import with_session
from gateway.api.wire import Wire
from gateway.inference.ids import random_id
from gateway.inference.types import Delta
from gateway.observability import metrics
from gateway.observability.access import RequestRecord
from gateway.serving.conductor import Ask, Conductor, Plan, Stream
from gateway.serving.runtime import Runtime
from gateway.transport.streaming import (
    ClientGone,
    DisconnectWatch,
    EventStreamResponse,
    StreamCut,
)

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
    if declared is not None and declared.isdigit() and int(declared) > limit:
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
    try:
        conductor = conductor_of(request)
        identity = await runtime.auth.authenticate(wire.credentials(request.headers))
        record.tenant, record.key_id = identity.name, identity.key_id
        try:
            body = await read_body(request, runtime.config.gateway.server.max_body_bytes)
            data = decode_json(body)
            route = conductor.authorize(identity, requested_model(data), record)
            parse = wire.parse
            if wire.prepare is not None:  # a stored conversation to continue
                parse = await wire.prepare(runtime, identity, data, len(body))
            inference = parse(data, route.config.max_tokens_default)
            headers = request.headers
            inference = with_session(inference, headers, data, route.config.routing)
            ask = Ask(
                identity, route, inference, record, data,
                headers.get("x-priority"), headers.get("x-request-timeout"), len(body),
            )  # fmt: skip
            plan = await conductor.plan(ask)
        except errors.CLIENT_ERRORS as exc:
            # A context too long, a missing capability...: refused, and counted.
            error = errors.client_error(exc)
            error.headers.update(await conductor.count_refused(identity, record, error.status))
            if error is exc:
                raise
            raise error from exc
        except ClientGone:
            raise  # a 499, below: the client left while it sent its body
        except Exception as exc:
            # The gateway's own fault, on the client's request: counted as a 4xx is, so
            # that no request shape is free to repeat (nor its traceback to log).
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            failed = _unhandled(record)
            failed.headers.update(await conductor.count_refused(identity, record, failed.status))
            raise failed from exc
        return await _serve_planned(request, wire, runtime, conductor, plan)
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


def _unhandled(record: RequestRecord) -> APIError:
    return APIError(
        500,
        "The gateway failed to handle the request.",
        type="server_error",
        headers={"x-request-id": record.request_id},
    )


async def _serve_planned(
    request: Request, wire: Wire, runtime: Runtime, conductor: Conductor, plan: Plan
) -> Response:
    """A planned request, once: answered, or the stored answer of its Idempotency-Key."""
    ask = plan.ask
    try:
        idempotency = await claim(runtime, ask.identity, request, plan.inference, ask.data)
    except APIError as exc:  # a key in use, reused, or malformed: refused, and counted
        exc.headers.update(await conductor.count_refused(ask.identity, ask.record, exc.status))
        raise
    if isinstance(idempotency, Response):
        # The stored answer to an earlier run. It asks for no inference, but its body was
        # read and parsed: it counts as one request, as count_tokens does.
        idempotency.headers.update(await conductor.count(ask.identity, ask.route.name))
        ask.record.finish(idempotency.status_code)
        return idempotency
    try:
        if plan.inference.stream:
            return await _stream(request, wire, runtime, conductor, plan)
        response = await _complete(request, wire, runtime, conductor, plan)
    except BaseException:
        # Whatever failed, cancels included, a retry with the same key must be able to run.
        await idempotency.abandon()
        raise
    await idempotency.complete(response)
    return response


def _with_wire_headers(wire: Wire, headers: dict[str, str]) -> dict[str, str]:
    if wire.more_headers is not None:
        headers.update(wire.more_headers(headers))
    return headers


async def _complete(
    request: Request, wire: Wire, runtime: Runtime, conductor: Conductor, plan: Plan
) -> Response:
    watch = DisconnectWatch(request.receive)
    try:
        answer = await conductor.answer(plan, watch)
    finally:
        watch.stop()  # before the answer goes out: its end looks like a disconnect
    record = plan.ask.record
    body = wire.body(
        answer.parts, answer.completions, response_id=record.request_id, model=answer.model
    )
    headers = _with_wire_headers(wire, answer.headers)
    if wire.keep is not None:
        headers.update(await wire.keep(runtime, plan.ask.identity, answer.parts[0], body))
    return Response(
        body,
        media_type="application/json",
        headers=headers,
        background=BackgroundTask(_answered, record),
    )


async def _answered(record: RequestRecord) -> None:
    # Run once the answer is sent: its metrics and log line cost the client no time.
    record.finish(200)


async def _stream(
    request: Request, wire: Wire, runtime: Runtime, conductor: Conductor, plan: Plan
) -> Response:
    # The conductor answers after the first piece, so a failure up to here is a plain
    # HTTP error (and another replica or model could still be tried).
    watch = DisconnectWatch(request.receive)
    try:
        stream = await conductor.stream(plan, watch)
    except BaseException:
        watch.stop()
        raise
    # From here the relay watches the client (no more cancelling this task).
    watch.on_gone = None
    headers = {**_SSE_HEADERS, **_with_wire_headers(wire, stream.headers)}
    end = _StreamEnd(stream, stream.served.route.name)
    if len(stream.opened) == 1:
        events = _sse_events(wire, runtime, plan, stream, end)
    else:
        events = _sse_choices(plan, stream, end)
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
        end.status = status
        await end()


async def _sse_choices(plan: Plan, stream: Stream, end: _StreamEnd) -> AsyncGenerator[bytes, None]:
    """The events of a stream of several choices (`n`, or a completion's prompts): each
    choice's pieces as they arrive, with its `index`; a choice's finish when it ends."""
    parts = plan.parts
    model = stream.served.route.name
    writer = ChunkWriter(parts[0], response_id=plan.ask.record.request_id, model=model)
    status = 499
    checked = parts[0].options.response_format is not None
    texts: list[list[str]] = [[] for _ in parts]
    called = [False] * len(parts)
    merged = stream.pieces()

    def events(index: int, delta: Delta) -> Iterator[bytes]:
        stream.add(delta, index)
        if delta.text:
            if checked:  # kept only to check it against `response_format`
                texts[index].append(delta.text)
            yield writer.text(delta.text, delta.logprobs, index)
        if delta.tool_calls:
            called[index] = True
            yield writer.tool_calls(delta.tool_calls, index)

    try:
        for index, (first, _, _) in enumerate(stream.opened):
            if parts[index].echo:
                yield writer.text(parts[index].prompt, index=index)
            if first is not None:
                for event in events(index, first):
                    yield event
        async for index, piece in merged:
            if piece is not None:
                for event in events(index, piece):
                    yield event
                continue
            finish = stream.finish_reason(index, called[index])
            try:
                stream.check(index, "".join(texts[index]), called[index], finish)
            except errors.CLIENT_ERRORS as exc:
                invalid = errors.client_error(exc)
                status = invalid.status
                yield sse_error(invalid.body())
                return
            yield writer.finish(finish, index)
        if parts[0].include_usage:
            yield writer.usage(stream.usage())
        yield SSE_DONE
        status = 200
    except Exception as exc:
        failed = errors.stream_failure(model, exc)
        status = failed.status
        yield sse_error(failed.body())
    finally:
        # Before the streams close: its readers of them must stop first (a client that
        # left mid-stream ends this generator while they wait for pieces).
        await merged.aclose()
        end.status = status
        await end()
