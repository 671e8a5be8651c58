"""`/v1/chat/completions` and `/v1/completions`: the request path, step by step.

auth -> body -> model -> parse -> idempotency -> rate limit -> dispatch (admission,
fallback chain, replicas) -> response (JSON, or SSE) -> settle (background).

Every request that arrives is answered (or its client is gone) and ends in one
`RequestRecord`: counted and logged once, whatever ended it. While a request is queued or
waits for the upstream, a `DisconnectWatch` notices its client leaving and cancels it
(queue place, slot and upstream call go at once; logged 499).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.admission import DeadlineExceeded, Overloaded, Shed
from gateway.api import errors
from gateway.api.body import decode_json, requested_model
from gateway.api.endpoints import count_request, runtime_of
from gateway.api.errors import MAX_SHOWN_MODEL, APIError, rate_limited
from gateway.api.idempotency import claim
from gateway.api.openai import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.api.openai.openai_answers import SSE_DONE, ChunkWriter, sse_error
from gateway.api.responses import RESPONSES
from gateway.api.sessions import with_session
from gateway.api.wire import Wire
from gateway.backends.base import UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.inference.ids import random_id
from gateway.inference.structured import output_problem
from gateway.inference.tokens import estimate_request_tokens, estimate_tokens
from gateway.inference.types import (
    Completion,
    Delta,
    InferenceRequest,
    RequestKind,
    UpstreamCall,
    Usage,
    UsageMeter,
)
from gateway.observability import metrics
from gateway.observability.access import RequestRecord
from gateway.ratelimit.limiter import Decision
from gateway.serving.auth import Identity
from gateway.serving.chain import check_context, fallback_chain
from gateway.serving.dispatch import DeadlineMissed, Served, Work
from gateway.serving.fanout import gather_all, interleave, split
from gateway.serving.runtime import Runtime
from gateway.transport.streaming import ClientGone, DisconnectWatch, EventStreamResponse, StreamCut
from gateway.upstream.failover import NoReplicaLeft
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# What the dispatcher may raise instead of answering.
_DISPATCH_ERRORS = (UpstreamError, NoReplicaLeft, DeadlineMissed, Overloaded)


async def chat_completions(request: Request) -> Response:
    return await serve(request, CHAT)


async def completions(request: Request) -> Response:
    return await serve(request, COMPLETIONS)


async def embeddings(request: Request) -> Response:
    return await serve(request, EMBEDDINGS)


async def responses(request: Request) -> Response:
    return await serve(request, RESPONSES)


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


@dataclass(slots=True)
class _Exchange:
    """One admitted request on its way through the gateway."""

    runtime: Runtime
    route: ModelRoute
    wire: Wire
    # One per part of the request (`gateway.serving.fanout`): usually just one.
    works: list[Work]
    decision: Decision
    record: RequestRecord
    # Why a stream ended before its last event, if it did.
    cut: StreamCut | None = None

    @property
    def work(self) -> Work:
        """The first part: the request itself, unless it has several."""
        return self.works[0]

    @property
    def response_id(self) -> str:
        return self.record.request_id

    def charge(self, used_tokens: int) -> None:
        if self.decision.reservation is not None:
            self.runtime.limiter.charge(self.decision.reservation, used_tokens)

    def settle(self, used_tokens: int) -> None:
        if self.decision.reservation is not None:
            self.runtime.limiter.settle(self.decision.reservation, used_tokens)

    def cut_short(self, reason: StreamCut) -> None:
        """The client stopped reading or left: the stream ends here."""
        self.cut = reason
        metrics.labels(metrics.STREAMS_CUT, self.route.name, reason.value).inc()

    def headers(self, served: Served) -> dict[str, str]:
        headers = dict(self.decision.headers)
        headers["x-request-id"] = self.record.request_id
        headers["x-gateway-queue-ms"] = str(round(served.queued_s * 1000))
        fallback = served.header()
        if fallback is not None:
            headers["x-gateway-fallback"] = fallback
        if self.work.request.omitted_tools:  # never left out silently
            headers["x-gateway-omitted-tools"] = omitted_header(self.work.request.omitted_tools)
        if self.wire.more_headers is not None:
            headers.update(self.wire.more_headers(headers))
        return headers

    def served_by(self, served: Sequence[Served], usage: Usage) -> None:
        """Fill the request's record with who served it (its first part's answer: the
        model, queue wait and fallbacks the client is told of) and what it used."""
        record = self.record
        first = served[0]
        record.served_model = first.route.name
        record.queue_wait_s = first.queued_s
        record.ttft_s = first.ttft_s
        record.prompt_tokens = usage.prompt_tokens
        record.completion_tokens = usage.completion_tokens
        record.fallbacks = [f"{f.source}->{f.target}:{f.reason.value}" for f in first.fallbacks]
        for part in served:
            for step in part.fallbacks:
                metrics.FALLBACKS.labels(step.source, step.target, step.reason.value).inc()

    def watch(self, request: Request) -> DisconnectWatch:
        """A watch that cancels this task when the client leaves (its body has been read).

        Unless the client is gone already (`gone`, and nothing cancelled): check first.
        """
        watch = DisconnectWatch(request.receive)
        task = asyncio.current_task()
        if not watch.gone and task is not None:
            watch.on_gone = task.cancel
        return watch

    def failed(self, exc: BaseException, watch: DisconnectWatch, dispatched: float) -> NoReturn:
        """Raise what a failed dispatch means for the client: its APIError, ClientGone
        for the watch's own cancel (taken back), or `exc` itself."""
        if isinstance(exc, _DISPATCH_ERRORS):
            raise self.refused(exc, dispatched) from exc
        if isinstance(exc, asyncio.CancelledError) and watch.gone:
            task = asyncio.current_task()
            if task is not None and task.uncancel() == 0:  # nobody else cancelled it
                raise ClientGone from None
        raise exc

    def refused(self, exc: Exception, dispatched: float) -> APIError:
        """The client's error for a request the dispatcher could not serve, with the rate
        limit headers; the time it spent queued first, if it was, goes in its record."""
        context = exc.__context__
        if isinstance(context, DeadlineExceeded):  # still queued at its deadline
            if context.waited_s:  # 0: the deadline had passed before it could queue
                self.record.queue_wait_s = context.waited_s
                self.record.queue_model = context.model
        elif isinstance(exc, Shed):  # queued, then gave way to a higher class
            self.record.queue_wait_s = time.monotonic() - dispatched
            self.record.queue_model = exc.model
        elif self.work.admissions:  # admitted (at once, or after a wait), then failed
            self.record.queue_model, self.record.queue_wait_s = self.work.admissions[-1]
        error = dispatch_error(self.route.name, exc)
        if self.decision.headers:
            error.headers = {**self.decision.headers, **error.headers}
        return error


async def serve(request: Request, wire: Wire) -> Response:
    """Serve one request of `wire`'s API, start to end."""
    # Counted and logged from the start, whatever happens: tenant and model are "-" until
    # known (a model only once it is a configured one).
    record = RequestRecord(wire.id_prefix + random_id(), endpoint=wire.name)
    try:
        runtime = runtime_of(request)
        identity = runtime.auth.identify(wire.credentials(request.headers))
        record.tenant = identity.name
        try:
            body = await read_body(request, runtime.config.gateway.server.max_body_bytes)
            data = decode_json(body)
            route = resolve_route(runtime, identity, requested_model(data), record)
            prepared = await _prepare(request, runtime, identity, route, wire, data, record)
        except (APIError, *errors.DOMAIN_ERRORS) as exc:
            error = errors.client_error(exc)  # a context too long, a missing capability...
            await _count_refused(runtime, identity, record, error)
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
            await _count_refused(runtime, identity, record, failed)
            raise failed from exc
        return await _serve_model(request, runtime, identity, route, wire, data, record, prepared)
    except (APIError, *errors.DOMAIN_ERRORS) as exc:
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


# Left-out tool types a header names at most: 512 types of 64 characters made a 33 KB
# header, past what proxies take (4 to 8 KB).
MAX_OMITTED_IN_HEADER = 16


def omitted_header(types: tuple[str, ...]) -> str:
    """The `x-gateway-omitted-tools` value: the types left out, the first 16 of them."""
    shown = ", ".join(types[:MAX_OMITTED_IN_HEADER])
    more = len(types) - MAX_OMITTED_IN_HEADER
    return f"{shown}, and {more} more" if more > 0 else shown


def _unhandled(record: RequestRecord) -> APIError:
    return APIError(
        500,
        "The gateway failed to handle the request.",
        type="server_error",
        headers={"x-request-id": record.request_id},
    )


async def _count_refused(
    runtime: Runtime, identity: Identity, record: RequestRecord, refused: APIError
) -> None:
    """A request refused before admission (a 4xx of its own making, or a 500 the gateway
    met on it) still counts against its tenant's request limit: reading, parsing and
    checking it cost the gateway work the client chose, so a tenant cannot send bad
    requests without end. The refusal carries the rate-limit headers; once the limit is
    spent, the 429 takes its place. If the limiter cannot tell (Redis down, fail-closed),
    the refusal stands as it is. A 429 or a 503 (the limiter or capacity) is not counted."""
    if refused.status < 400 or refused.status in (429, 503, 504):
        return
    model = record.model if record.model in runtime.routes else ""
    with contextlib.suppress(*errors.DOMAIN_ERRORS):
        refused.headers.update(await count_request(runtime, identity, model))


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A parsed and checked request, ready to be admitted: its parts, each planned."""

    inference: InferenceRequest
    parts: list[InferenceRequest]
    planned: list[_Plan]
    priority: str
    deadline: float


async def _prepare(
    request: Request,
    runtime: Runtime,
    identity: Identity,
    route: ModelRoute,
    wire: Wire,
    data: Mapping[str, Any],
    record: RequestRecord,
) -> _Prepared:
    """Parse and check a request, and plan each of its parts; a 4xx for what is wrong."""
    parse = wire.parse if wire.prepare is None else await wire.prepare(runtime, identity.name, data)
    inference = parse(data, route.config.max_tokens_default)
    inference = with_session(inference, request.headers, data, route.config.routing)
    _check_model_kind(route, inference)
    record.stream = inference.stream
    if runtime.config.gateway.server.log_prompts:
        record.prompt = _logged_prompt(inference)
    limit = route.config.max_tokens_limit
    if inference.params.max_tokens > limit:
        if route.config.max_tokens_policy == "refuse":
            field = next(
                (f for f in ("max_completion_tokens", "max_output_tokens") if data.get(f)),
                "max_tokens",
            )
            raise errors.bad_request(f"`{field}` may be at most {limit} for `{route.name}`.", field)
        # Clamped: served with the limit, reserved at it, and an answer that reaches it
        # is cut at max_tokens (the finish reason compares with params.max_tokens).
        inference = replace(
            inference,
            params=replace(inference.params, max_tokens=limit),
            requested_max_tokens=None if inference.requested_max_tokens is None else limit,
        )
    priority = record.priority = _priority(runtime, identity, request.headers.get("x-priority"))
    deadline = _deadline(route, request.headers.get("x-request-timeout"))
    embeddings = route.config.capabilities.embeddings
    parts = split(inference, embeddings.max_batch if embeddings is not None else 1)
    # The chain's context check takes the longest part (a completion's longest prompt).
    longest = parts[0] if len(parts) == 1 else max(parts, key=estimate_request_tokens)
    chain = fallback_chain(runtime.routes, identity, route, longest)
    # Each part as it leaves for each model of the chain, and what it costs.
    planned = [_plan(runtime, identity, route, chain, part, record) for part in parts]
    return _Prepared(inference, parts, planned, priority, deadline)


async def _serve_model(
    request: Request,
    runtime: Runtime,
    identity: Identity,
    route: ModelRoute,
    wire: Wire,
    data: Mapping[str, Any],
    record: RequestRecord,
    prepared: _Prepared,
) -> Response:
    inference, parts, planned = prepared.inference, prepared.parts, prepared.planned
    priority, deadline = prepared.priority, prepared.deadline
    try:
        idempotency = await claim(runtime, identity, request, inference, data)
    except APIError as exc:  # a key in use, reused, or malformed: refused, and counted
        await _count_refused(runtime, identity, record, exc)
        raise
    if isinstance(idempotency, Response):
        # The stored answer to an earlier run. It asks for no inference, but its body was
        # read and parsed: it counts as one request, as count_tokens does.
        idempotency.headers.update(await count_request(runtime, identity, route.name))
        record.finish(idempotency.status_code)
        return idempotency

    cost = sum(plan.cost for plan in planned)
    try:
        decision = await runtime.limiter.admit(identity.name, route.name, cost, deadline)
        if not decision.allowed:
            raise rate_limited(decision)
        works = [
            Work(
                part, plan.chain, identity.name, identity.tenant.share, priority, plan.cost,
                deadline, plan.call, outbound=plan.outbound,
            )
            for part, plan in zip(parts, planned, strict=True)
        ]  # fmt: skip
        exchange = _Exchange(runtime, route, wire, works, decision, record)
        if inference.stream:
            return await _stream(exchange, request)
        response = await _complete(exchange, request)
    except BaseException:
        # Whatever failed, cancels included, a retry with the same key must be able to run.
        await idempotency.abandon()
        raise
    await idempotency.complete(response)
    return response


@dataclass(frozen=True, slots=True)
class _Plan:
    """One part of a request, ready to dispatch: the models it may go to, the call to the
    first, what each is sent where outbound sanitization masked it, its cost in tokens."""

    chain: list[ModelRoute]
    call: UpstreamCall
    outbound: Sequence[InferenceRequest] | None
    cost: int


def _plan(
    runtime: Runtime,
    identity: Identity,
    route: ModelRoute,
    chain: list[ModelRoute],
    part: InferenceRequest,
    record: RequestRecord,
) -> _Plan:
    outbound = runtime.outbound.prepare(
        identity.name, identity.tenant, [r.name for r in chain], part, record.request_id
    )
    if outbound is not None:  # an external model in the chain: what leaves is sanitized
        chain = [runtime.routes[name] for name in outbound.models]
    call = route.upstream_call(part if outbound is None else outbound.requests[0])
    check_context(route, call.prompt_estimate, part)
    return _Plan(
        chain,
        call,
        None if outbound is None else outbound.requests,
        call.prompt_estimate + _completion_reserve(runtime, part),
    )


def _check_model_kind(route: ModelRoute, inference: InferenceRequest) -> None:
    """An embedding request needs an embedding model, and any other request another
    model; an embedding request's inputs and `dimensions` must suit the model."""
    embeddings = route.config.capabilities.embeddings
    if (inference.kind is RequestKind.EMBEDDING) != (embeddings is not None):
        raise errors.wrong_model_kind(route.name, embedding=embeddings is not None)
    if embeddings is None:
        return
    if len(inference.inputs) > embeddings.max_inputs:
        raise errors.bad_request(
            f"`input` may hold at most {embeddings.max_inputs} texts for `{route.name}`.",
            "input",
        )
    for index, text in enumerate(inference.inputs):
        tokens = estimate_tokens(text)
        if tokens > embeddings.max_input_tokens:
            where = f"input[{index}]" if len(inference.inputs) > 1 else "input"
            raise errors.bad_request(
                f"`{where}` is about {tokens} tokens; `{route.name}` takes at most "
                f"{embeddings.max_input_tokens} tokens a text.",
                where,
            )
    dimensions = inference.dimensions
    if dimensions is not None and dimensions != embeddings.dimensions:
        if not embeddings.shortenable:
            raise errors.unsupported_parameter(route.name, "dimensions")
        if dimensions > embeddings.dimensions:
            raise errors.bad_request(
                f"`dimensions` may be at most {embeddings.dimensions} for `{route.name}`.",
                "dimensions",
            )


def _logged_prompt(inference: InferenceRequest) -> str:
    if inference.kind is RequestKind.EMBEDDING:
        return "\n".join(inference.inputs)
    if inference.prompts:
        return "\n".join(inference.prompts)
    return inference.prompt or "\n".join(f"{m.role}: {m.content}" for m in inference.messages)


def resolve_route(
    runtime: Runtime, identity: Identity, model: str, record: RequestRecord | None = None
) -> ModelRoute:
    """The model a request names (or an alias of), which the caller's tenant may use;
    `record` takes its name as soon as it is known."""
    route = runtime.routes.get(model) or runtime.routes.get(
        runtime.aliases.resolve(identity.name, model) or ""
    )
    if route is None:
        raise errors.model_not_found(model)
    if record is not None:
        record.model = route.name
        if route.name != model:
            record.alias = model[:MAX_SHOWN_MODEL]
    if not identity.may_use(route.name):
        raise errors.model_not_allowed(model)
    return route


def _priority(runtime: Runtime, identity: Identity, asked: str | None) -> str:
    """The tenant's class, or a lower one the request asks for (never a higher one)."""
    own = identity.tenant.priority
    if asked is None:
        return own
    classes = runtime.config.gateway.admission.classes
    if asked not in classes:
        raise errors.bad_request(f"`x-priority` must be one of {', '.join(classes)}.", "x-priority")
    return asked if classes.index(asked) > classes.index(own) else own


def _deadline(route: ModelRoute, asked: str | None) -> float:
    """When the request must be answered: `x-request-timeout` seconds from now, capped by
    the model's `timeouts.total_s`."""
    limit = route.config.timeouts.total_s
    if asked is not None:
        try:
            seconds = float(asked)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise errors.bad_request(
                "`x-request-timeout` must be a positive number of seconds.", "x-request-timeout"
            )
        limit = min(limit, seconds)
    return time.monotonic() + limit


def _completion_reserve(runtime: Runtime, inference: InferenceRequest) -> int:
    """Completion tokens to reserve: the client's max_tokens, else a configured estimate."""
    if inference.requested_max_tokens is not None:
        return inference.requested_max_tokens
    estimate = runtime.config.gateway.ratelimit.completion_tokens_estimate
    return min(inference.params.max_tokens, estimate)


async def _complete(exchange: _Exchange, request: Request) -> Response:
    used = 0
    answered: set[int] = set()
    dispatcher = exchange.runtime.dispatcher

    async def dispatch(index: int, work: Work) -> tuple[Completion, Served]:
        nonlocal used
        completion, served = await dispatcher.complete(work)
        if completion.usage.prompt_tokens == 0:
            completion.usage.prompt_tokens = work.first_call.prompt_estimate
        used += completion.usage.total_tokens
        answered.add(index)
        return completion, served

    dispatched = time.monotonic()
    watch = exchange.watch(request)
    try:
        if watch.gone:
            raise ClientGone
        results = await gather_all([dispatch(i, work) for i, work in enumerate(exchange.works)])
    except BaseException as exc:
        if watch.gone or isinstance(exc, _CUT_BY_TIME):
            # Left, or cut at its deadline (which the client may choose), while its parts
            # were with a replica: they are paid for in full.
            pending = (w for i, w in enumerate(exchange.works) if i not in answered)
            used += sum(_unseen_cost(work, whole=True) for work in pending)
        exchange.failed(exc, watch, dispatched)
    finally:
        watch.stop()  # before the answer goes out: its end looks like a disconnect
        exchange.settle(used)
    completions = [completion for completion, _ in results]
    served = [part for _, part in results]
    usage = completions[0].usage
    if len(completions) > 1:
        usage = Usage.sum_of(c.usage for c in completions)
    exchange.served_by(served, usage)
    model = served[0].route.name
    parts = [work.request for work in exchange.works]
    fmt = parts[0].options.response_format
    for completion in completions:
        # An answer cut at its token limit is no answer to check: it goes out as cut
        # (`length`), as OpenAI sends it, for the client to see why.
        if fmt is not None and not completion.tool_calls and completion.finish_reason != "length":
            problem = output_problem(fmt, completion.text)
            if problem is not None:
                raise errors.invalid_structured_output(model, problem)
    body = exchange.wire.body(parts, completions, response_id=exchange.response_id, model=model)
    if exchange.wire.keep is not None:
        await exchange.wire.keep(exchange.runtime, exchange.record.tenant, parts[0], body)
    return Response(
        body,
        media_type="application/json",
        headers=exchange.headers(served[0]),
        background=BackgroundTask(_answered, exchange.record),
    )


# Failures that end a request by its time while a replica may still be computing it.
_CUT_BY_TIME = (DeadlineMissed, UpstreamTimeout)


def _unseen_cost(work: Work, *, whole: bool) -> int:
    """The tokens a part costs when it ended before its answer was seen (its client left,
    or its deadline passed): none if it never reached a replica (it was still queued),
    else its prompt and, for a `whole` (non-streamed) answer, all the completion it may
    have generated. A whole answer says nothing of how far the replica got before the
    cancel reached it (or whether it stopped: not every backend can), so the most it
    could have generated is charged; a stream is metered piece by piece, and before its
    first piece it has generated nothing. A replica's own failure costs the client
    nothing (not its fault), so it is not charged here."""
    if not work.admissions:
        return 0
    call = work.first_call
    return call.prompt_estimate + (call.params.max_tokens if whole else 0)


async def _answered(record: RequestRecord) -> None:
    # Run once the answer is sent: its metrics and log line cost the client no time.
    record.finish(200)


_Opened = tuple[Delta | None, AsyncGenerator[Delta, None], Served]


async def _close(opened: _Opened) -> None:
    await opened[1].aclose()


async def _stream(exchange: _Exchange, request: Request) -> Response:
    # The dispatcher answers after the first piece, so a failure up to here is a plain
    # HTTP error (and another replica or model could still be tried).
    dispatched = time.monotonic()
    watch = exchange.watch(request)
    dispatcher = exchange.runtime.dispatcher
    try:
        if watch.gone:
            raise ClientGone
        opened = await gather_all([dispatcher.stream(w) for w in exchange.works], _close)
    except BaseException as exc:
        watch.stop()
        # Left, or cut at a deadline, while a replica computed its prompt: that prompt is
        # paid for.
        cut = watch.gone or isinstance(exc, _CUT_BY_TIME)
        exchange.settle(sum(_unseen_cost(w, whole=False) for w in exchange.works) if cut else 0)
        exchange.failed(exc, watch, dispatched)
    # From here the relay watches the client (no more cancelling this task).
    watch.on_gone = None
    served = opened[0][2]
    headers = {**_SSE_HEADERS, **exchange.headers(served)}
    end = _StreamEnd(exchange, [part for _, _, part in opened], [rest for _, rest, _ in opened])
    if len(opened) == 1:
        first, deltas, _ = opened[0]
        events = _sse_events(exchange, served, first, deltas, end)
    else:
        events = _sse_choices(exchange, opened, end)
    server = exchange.runtime.config.gateway.server
    ping = exchange.wire.ping
    return EventStreamResponse(
        events,
        stall_timeout_s=server.stream_stall_timeout_s,
        headers=headers,
        on_cut=exchange.cut_short,
        on_close=end,
        watch=watch,
        keepalive=None if ping is None else (server.stream_ping_interval_s, ping),
    )


@dataclass(slots=True)
class _StreamEnd:
    """What ends a stream, run once: by the events generator when it ends, or by the
    response when the generator never started (its `finally` would not run then)."""

    exchange: _Exchange
    served: list[Served]
    # The rest of each part's stream, and what each used.
    streams: list[AsyncGenerator[Delta, None]]
    meters: list[UsageMeter] = field(init=False)
    # 499, as nginx logs it, unless the stream ran to its end or its error event.
    status: int = 499
    done: bool = False

    def __post_init__(self) -> None:
        self.meters = [UsageMeter() for _ in self.streams]

    def usage(self) -> Usage:
        """What every part used so far (prompt tokens estimated until reported)."""
        works = self.exchange.works
        if len(works) == 1:
            return self.meters[0].usage(works[0].first_call.prompt_estimate)
        return Usage.sum_of(
            meter.usage(work.first_call.prompt_estimate)
            for meter, work in zip(self.meters, works, strict=True)
        )

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        exchange = self.exchange
        try:
            for stream in self.streams:
                await stream.aclose()  # cancels the upstream request if still open
        finally:
            usage = self.usage()
            exchange.settle(usage.total_tokens)
            exchange.served_by(self.served, usage)
            # The client closed the request or stopped reading.
            exchange.record.finish(499 if exchange.cut is not None else self.status)


async def _sse_events(
    exchange: _Exchange,
    served: Served,
    first: Delta | None,
    deltas: AsyncGenerator[Delta, None],
    end: _StreamEnd,
) -> AsyncGenerator[bytes, None]:
    request = exchange.work.request
    prompt_estimate = exchange.work.first_call.prompt_estimate
    writer = exchange.wire.stream_writer(
        request, exchange.response_id, served.route.name, prompt_estimate
    )
    meter = end.meters[0]
    # 499 until the stream has run to its end or to its error event.
    status = 499
    charging = exchange.decision.reservation is not None
    try:
        called = False
        # Kept only to check it against `response_format` at the end.
        fmt = request.options.response_format
        text: list[str] = []
        opening = writer.start()
        if opening:
            yield opening
        # The first piece and the rest are handled alike, written out twice: a shared
        # helper would cost every streamed chunk a call on the hot path.
        if request.echo:
            yield writer.text(request.prompt)
        if first is not None:
            meter.add(first)
            if first.text:
                if fmt is not None:
                    text.append(first.text)
                yield writer.text(first.text, first.logprobs)
            if first.tool_calls:
                called = True
                yield writer.tool_calls(first.tool_calls)
            async for delta in deltas:
                meter.add(delta)
                if charging:
                    exchange.charge(meter.usage(prompt_estimate).total_tokens)
                if delta.text:
                    if fmt is not None:
                        text.append(delta.text)
                    yield writer.text(delta.text, delta.logprobs)
                if delta.tool_calls:
                    called = True
                    yield writer.tool_calls(delta.tool_calls)
        usage = meter.usage(prompt_estimate)
        finish = meter.finish_reason or exchange.work.first_call.finish_reason(
            usage.completion_tokens, called
        )
        checked = fmt is not None and not called and finish != "length"
        problem = output_problem(fmt, "".join(text)) if checked and fmt is not None else None
        if problem is not None:
            # The text has gone out; the stream ends with an error instead of its finish.
            invalid = errors.invalid_structured_output(served.route.name, problem)
            status = invalid.status
            yield writer.error(invalid)
            return
        yield writer.close(finish, usage)
        status = 200
        answer = writer.answer()
        if answer is not None and exchange.wire.keep is not None:
            await exchange.wire.keep(exchange.runtime, exchange.record.tenant, request, answer)
    except Exception as exc:
        # Headers are gone: the failure becomes a terminal error event.
        failed = _stream_failure(served.route.name, exc)
        status = failed.status
        yield writer.error(failed)
    finally:
        end.status = status
        await end()


def _stream_failure(model: str, exc: Exception) -> APIError:
    """What a stream's terminal error event says of a failure after its headers."""
    if isinstance(exc, UpstreamError | NoReplicaLeft):
        return dispatch_error(model, exc)
    # A bug, or an upstream that sent what no backend expects: still a terminal event.
    log.exception("stream of %s failed", model)
    return APIError(500, "The gateway failed while streaming the answer.", type="server_error")


async def _sse_choices(
    exchange: _Exchange, opened: Sequence[_Opened], end: _StreamEnd
) -> AsyncGenerator[bytes, None]:
    """The events of a stream of several choices (`n`, or a completion's prompts): each
    choice's pieces as they arrive, with its `index`; a choice's finish when it ends."""
    parts = [work.request for work in exchange.works]
    served = opened[0][2]
    writer = ChunkWriter(parts[0], response_id=exchange.response_id, model=served.route.name)
    meters = end.meters
    status = 499
    fmt = parts[0].options.response_format
    texts: list[list[str]] = [[] for _ in parts]
    called = [False] * len(parts)
    merged = interleave([rest for _, rest, _ in opened])

    def events(index: int, delta: Delta) -> Iterator[bytes]:
        meters[index].add(delta)
        if delta.text:
            if fmt is not None:  # kept only to check it against `response_format`
                texts[index].append(delta.text)
            yield writer.text(delta.text, delta.logprobs, index)
        if delta.tool_calls:
            called[index] = True
            yield writer.tool_calls(delta.tool_calls, index)

    try:
        for index, (first, _, _) in enumerate(opened):
            if parts[index].echo:
                yield writer.text(parts[index].prompt, index=index)
            if first is not None:
                for event in events(index, first):
                    yield event
        async for index, delta in merged:
            if delta is not None:
                for event in events(index, delta):
                    yield event
                if exchange.decision.reservation is not None:
                    exchange.charge(end.usage().total_tokens)
                continue
            meter = meters[index]
            finish = meter.finish_reason or exchange.works[index].first_call.finish_reason(
                meter.completion_tokens, called[index]
            )
            checked = fmt is not None and not called[index] and finish != "length"
            text = "".join(texts[index])
            problem = output_problem(fmt, text) if checked and fmt is not None else None
            if problem is not None:
                invalid = errors.invalid_structured_output(served.route.name, problem)
                status = invalid.status
                yield sse_error(invalid.body())
                return
            yield writer.finish(finish, index)
        if parts[0].include_usage:
            yield writer.usage(end.usage())
        yield SSE_DONE
        status = 200
    except Exception as exc:
        failed = _stream_failure(served.route.name, exc)
        status = failed.status
        yield sse_error(failed.body())
    finally:
        # Before the streams close: its readers of them must stop first (a client that
        # left mid-stream ends this generator while they wait for pieces).
        await merged.aclose()
        end.status = status
        await end()


def dispatch_error(model: str, exc: Exception) -> APIError:
    """What the client is told when its request could not be served."""
    if isinstance(exc, Shed):
        return errors.overloaded(model, exc.retry_after_s, shed=True)
    if isinstance(exc, Overloaded):
        return errors.overloaded(model, exc.retry_after_s, shed=False)
    if isinstance(exc, DeadlineMissed):
        return errors.deadline_exceeded(str(exc))
    if isinstance(exc, NoReplicaLeft):
        return errors.no_replica(model)
    if isinstance(exc, UpstreamTimeout):
        return errors.upstream_timeout(model)
    if isinstance(exc, UpstreamRejected) and 400 <= exc.status < 500:
        return errors.bad_request(f"The backend for `{model}` refused the request: {exc}")
    return errors.upstream_failed(model, str(exc))
