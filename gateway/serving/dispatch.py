"""From an admitted request to upstream output: queueing, deadlines and the fallback chain.

For each model of the request's chain (the model asked for, then its fallbacks that the
tenant may use) the dispatcher:

1. routes to the next model up front when the predicted wait (queue ahead over the
   measured drain rate) plus the model's usual latency for a prompt of this size
   (`gateway.upstream.latency`) would miss the deadline;
2. waits for a slot in the model's admission queue (priority, fair share), or moves on
   when the queue is full;
3. calls the model (retrying on other replicas before any output); a stream that has
   not produced its first token within its budget (`timeouts.first_token_s`) is cancelled upstream
   and the next model is tried (the budget grows with the prompt: a base plus an
   allowance per prompt token). A stream that has started runs until the request's
   deadline at most, then ends with UpstreamTimeout (a terminal SSE error event).

Timed-out attempts teach the model's latency averages a lower bound, so the predicted
wait of step 1 learns that a model turned slow even when nothing it does finishes.

Each move is recorded as a `Fallback`, which the response reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.admission import (
    AdmissionController,
    DeadlineExceeded,
    Overloaded,
    ReplicaStarting,
    Slot,
)
from gateway.backends.base import UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.config import FallbackReason
from gateway.inference.types import Completion, Delta, InferenceRequest, UpstreamCall, UsageMeter
from gateway.observability import metrics, tracing
from gateway.observability.tracing import Attribute, RequestTrace
from gateway.upstream import failover
from gateway.upstream.failover import NoReplicaLeft, Timeout
from gateway.upstream.route import ModelRoute
from gateway.upstream.tool_calls import parser_for, read_completion, read_stream

if TYPE_CHECKING:
    from gateway.observability.tracing import Span

# What a client is told to wait when a model scaled to zero has no replica by its
# deadline: about a load of a model and a loop interval.
STARTING_RETRY_S = 10.0


class DeadlineMissed(Exception):
    """No model of the chain could answer before the request's deadline."""


@dataclass(frozen=True, slots=True)
class _MoveOn:
    """A model's failure that the next model of the chain may serve, if it falls back for
    `reason`; `failure` is what the request ends with if it does not."""

    reason: FallbackReason
    failure: Exception


_T = TypeVar("_T")
# One way of calling a model of the chain (a whole answer, or a stream's first piece):
# what it gives, or the failure it hands back to the fallback loop.
_CallModel = Callable[["Work", Slot, "Attempt"], Awaitable["_T | _MoveOn"]]


class DeadlineCut(UpstreamTimeout):
    """A stream that had started, cut at the request's deadline (the client's
    `x-request-timeout`, or its model's `timeouts.total_s`): the request's time, not a
    slow backend."""


@dataclass(frozen=True, slots=True)
class Fallback:
    source: str
    target: str
    reason: FallbackReason


@dataclass(slots=True)
class Served:
    """Which model served the request, and how it got there."""

    route: ModelRoute
    fallbacks: list[Fallback] = field(default_factory=list)
    queued_s: float = 0.0
    # Time to the first token, for streams.
    ttft_s: float | None = None

    def header(self) -> str | None:
        """`x-gateway-fallback`: `llm-large->llm-small; reason=ttft_timeout`."""
        return fallback_header(self.fallbacks)


def fallback_header(fallbacks: Sequence[Fallback]) -> str | None:
    """`x-gateway-fallback` for the moves `fallbacks` (None: there were none)."""
    if not fallbacks:
        return None
    path = "->".join([fallbacks[0].source, *(f.target for f in fallbacks)])
    return f"{path}; reason={fallbacks[-1].reason.value}"


@dataclass(slots=True)
class Attempt:
    """One call to a model of the chain: which, as what call, since when. `finished`
    once its outcome is known to the dispatcher (an answer or first piece seen, or a
    replica's own failure): an attempt left unfinished was cut (the client left, or the
    deadline came) while the replica may have been computing it."""

    route: ModelRoute
    call: UpstreamCall
    started: float
    ended: float | None = None
    finished: bool = False
    # Its span, while it is the dispatcher's to end (a stream's rest ends it).
    span: Span | None = None

    def ran_s(self) -> float:
        """How long it ran: to its end, or to now."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.started


# Whether the chain's model `index` may take the work by its own limits and budgets
# (`Work.gate`).
Gate = Callable[[int], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Work:
    """What the dispatcher needs to know about one request."""

    request: InferenceRequest
    chain: Sequence[ModelRoute]
    tenant: str
    share: float
    priority: str
    cost_tokens: int
    deadline: float  # time.monotonic() seconds
    # The request as the first model of the chain takes it (already rendered).
    first_call: UpstreamCall
    # Each admission it got, in order: (model, seconds it waited in that model's queue).
    admissions: list[tuple[str, float]] = field(default_factory=list)
    # The request as each model of the chain takes it, where outbound sanitization masked
    # it for some (`gateway.serving.outbound`); None: `request` for every one.
    outbound: Sequence[InferenceRequest] | None = None
    # Asked before the work falls back to a model: whether that model's own limits and
    # budgets take it (None: every model may). A fallback they refuse is not taken.
    gate: Gate | None = None
    # The request's trace, when it is traced.
    trace: RequestTrace | None = None
    # Its calls to models, in order, and its moves along the chain (kept here, so that a
    # request that fails after a fallback is recorded with it).
    attempts: list[Attempt] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    # The calls to the chain's later models, by index, once rendered (the gate asks for
    # one before the dispatcher sends it).
    _later_calls: dict[int, UpstreamCall] = field(default_factory=dict)

    @property
    def cut_attempt(self) -> Attempt | None:
        """The call a cut interrupted (the last, if its outcome was never seen)."""
        if self.attempts and not self.attempts[-1].finished:
            return self.attempts[-1]
        return None

    def call_for(self, index: int, route: ModelRoute) -> UpstreamCall:
        """The call to the chain's model `index` (`route`)."""
        if index == 0:
            return self.first_call
        call = self._later_calls.get(index)
        if call is None:
            request = self.request if self.outbound is None else self.outbound[index]
            call = self._later_calls[index] = route.upstream_call(request)
        return call


class Dispatcher:
    """Runs requests through admission and the fallback chain."""

    def __init__(self, admission: AdmissionController) -> None:
        self._admission = admission

    async def complete(self, work: Work) -> tuple[Completion, Served]:
        """The whole answer, from the first model of the chain that can give it in time."""
        return await self._through_chain(work, self._complete_on)

    async def stream(self, work: Work) -> tuple[Delta | None, AsyncGenerator[Delta, None], Served]:
        """The first piece of the answer, the rest of it, and who serves it.

        The rest holds the admission slot until it ends, fails or is closed, and no
        longer than the request's deadline, past which reading it raises UpstreamTimeout.
        Its `aclose` gives the slot back even if it was never iterated (and again does
        nothing). With no first piece (an empty answer) the slot is back already.
        """
        return await self._through_chain(work, self._stream_on)

    async def _through_chain(self, work: Work, call_model: _CallModel[_T]) -> _T:
        """The one fallback loop, whole answers and streams alike: for each model of the
        chain, a slot in its queue (or a move on, `_admit`), then `call_model` on it; a
        failure it hands back (`_MoveOn`) moves the work to the next model if that
        model falls back for it and takes it (`_may_fall_back`), and is raised if not."""
        trace = work.trace
        for index, route in enumerate(work.chain):
            span = None if trace is None else _model_span(trace, route, index)
            try:
                slot = await self._admit(work, index, work.fallbacks)
                if slot is None:
                    if span is not None:
                        _end_model_span(span, work.fallbacks[-1].reason.value)
                    continue
                attempt = Attempt(route, work.call_for(index, route), time.monotonic(), span=span)
                work.attempts.append(attempt)
                outcome = await call_model(work, slot, attempt)
            except BaseException as exc:
                if span is not None:
                    _end_model_span(span, type(exc).__name__, failed=True)
                raise
            if not isinstance(outcome, _MoveOn):
                if attempt.span is not None:
                    _end_model_span(attempt.span, "served")
                return outcome
            if span is not None:
                _end_model_span(span, outcome.reason.value, failed=True)
            if not await self._may_fall_back(work, index, outcome.reason, work.fallbacks):
                raise outcome.failure
        raise DeadlineMissed("no model of the fallback chain could take the request in time")

    async def _complete_on(
        self, work: Work, slot: Slot, attempt: Attempt
    ) -> tuple[Completion, Served] | _MoveOn:
        """The whole answer of `attempt`'s model, holding `slot` until it is in."""
        route, call, started = attempt.route, attempt.call, attempt.started
        used = 0
        try:
            # A timeout, unlike wait_for, runs the call in this task: no new task.
            with Timeout(work.deadline - started):
                completion = await failover.complete(route, call, work.deadline)
            parser = parser_for(route, call)
            if parser is not None:
                completion = read_completion(parser, completion)
        except TimeoutError:
            _learn_too_slow(route, work, call, time.monotonic() - started)
            raise DeadlineMissed(f"{route.name} did not answer before the deadline") from None
        except (UpstreamError, NoReplicaLeft) as exc:
            # As a stream before its first piece (below): a failure that is not the
            # request's own may be served by the next model of the chain.
            if isinstance(exc, UpstreamRejected):
                raise  # the request's own fault: another model would refuse it too
            if isinstance(exc, UpstreamTimeout):
                _learn_too_slow(route, work, call, time.monotonic() - started)
            else:
                attempt.finished = True  # the replica's failure: not the client's cost
            return _MoveOn(FallbackReason.REPLICA_ERROR, exc)
        else:
            attempt.finished = True
            used = completion.usage.total_tokens
            route.resilience.latency.observe(
                None, time.monotonic() - started, completion.usage.completion_tokens,
                call.prompt_estimate,
            )  # fmt: skip
            return completion, Served(route, work.fallbacks, slot.waited_s)
        finally:
            attempt.ended = time.monotonic()
            self._admission.release(slot, used)

    async def _stream_on(
        self, work: Work, slot: Slot, attempt: Attempt
    ) -> tuple[Delta | None, AsyncGenerator[Delta, None], Served] | _MoveOn:
        """`attempt`'s model's first piece and the rest of its stream (which holds `slot`
        from then on)."""
        route, call, started = attempt.route, attempt.call, attempt.started
        # The first piece must come within the model's budget for this prompt (and the
        # deadline); failover bounds each attempt by it, and blames a replica that
        # stays silent.
        budget = route.config.timeouts.first_token_budget(call.prompt_estimate)
        first_by = started + min(budget, work.deadline - started)
        deltas = failover.stream(route, call, work.deadline, first_by)
        parser = parser_for(route, call)
        if parser is not None:
            deltas = read_stream(parser, deltas)
        first: Delta | None
        try:
            first = await anext(deltas)
        except StopAsyncIteration:
            first = None
        except TimeoutError:
            attempt.ended = time.monotonic()
            await deltas.aclose()  # cancels the upstream request
            self._admission.release(slot, 0)
            _learn_slow_start(route, call, time.monotonic() - started)
            missed = DeadlineMissed(f"no first token from {route.name} in time")
            return _MoveOn(FallbackReason.TTFT_TIMEOUT, missed)
        except (UpstreamError, NoReplicaLeft) as exc:
            attempt.ended = time.monotonic()
            attempt.finished = not isinstance(exc, UpstreamTimeout)
            await deltas.aclose()
            self._admission.release(slot, 0)
            if isinstance(exc, UpstreamRejected):
                raise  # the request's own fault: another model would refuse it too
            if isinstance(exc, UpstreamTimeout):
                _learn_slow_start(route, call, time.monotonic() - started)
            return _MoveOn(FallbackReason.REPLICA_ERROR, exc)
        except BaseException:  # cancelled (the client left): the slot goes back
            attempt.ended = time.monotonic()
            await deltas.aclose()
            self._admission.release(slot, 0)
            raise
        # From its first piece on, a stream is metered piece by piece.
        attempt.ended, attempt.finished = time.monotonic(), True
        ttft = attempt.ended - started
        trace_id = None if work.trace is None else work.trace.trace_id
        metrics.observe(metrics.TTFT, (route.name,), ttft, trace_id)
        served = Served(route, work.fallbacks, slot.waited_s, ttft)
        rest = _Rest(
            self._admission, slot, route, call, first, deltas, started, ttft, work.deadline,
            attempt.span,
        )  # fmt: skip
        attempt.span = None  # the rest's to end, when the stream does
        return first, rest, served

    async def _admit(self, work: Work, index: int, fallbacks: list[Fallback]) -> Slot | None:
        """A slot on the chain's model `index`, or None when the work moves on."""
        route = work.chain[index]
        remaining = work.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineMissed("the deadline passed before a model could take the request")
        # The predicted wait only matters when it may move the work on: the last model of
        # the chain (the usual one-model chain), or one that does not fall back for it,
        # takes the work whatever the wait (and the prediction costs a slot count).
        if _falls_back_for(work, index, route, FallbackReason.PREDICTED_WAIT):
            # The prompt's size as the chain's first model takes it: about the same on all.
            predicted = self._admission.predicted_wait_s(
                route.name, work.priority
            ) + route.resilience.latency.expected_s(
                work.request.stream,
                work.request.params.max_tokens,
                work.first_call.prompt_estimate,
            )
            if predicted > remaining and await self._may_fall_back(
                work, index, FallbackReason.PREDICTED_WAIT, fallbacks
            ):
                return None
        try:
            slot = await self._admission.acquire(
                route.name,
                work.tenant,
                priority=work.priority,
                cost_tokens=work.cost_tokens,
                share=work.share,
                deadline=work.deadline,
            )
        except DeadlineExceeded as exc:
            _queued(work, route, "deadline", exc.waited_s)
            if not route.pool.replicas:
                # Scaled to zero: its first replica is on its way (docs/autoscaling.md).
                raise ReplicaStarting(route.name, work.priority, STARTING_RETRY_S) from None
            raise DeadlineMissed(f"still queued for {route.name} at the deadline") from None
        except Overloaded as exc:
            _queued(work, route, type(exc).__name__, 0.0)
            if await self._may_fall_back(work, index, FallbackReason.QUEUE_FULL, fallbacks):
                return None
            raise
        _queued(work, route, "admitted", slot.waited_s)
        work.admissions.append((route.name, slot.waited_s))
        return slot

    @staticmethod
    async def _may_fall_back(
        work: Work, index: int, reason: FallbackReason, fallbacks: list[Fallback]
    ) -> bool:
        """Whether the work moves to the next model for `reason` (and record it if so):
        the model falls back for it, and the next model's own limits take the work."""
        route = work.chain[index]
        if not _falls_back_for(work, index, route, reason):
            return False
        if work.gate is not None and not await work.gate(index + 1):
            return False
        fallback = Fallback(route.name, work.chain[index + 1].name, reason)
        fallbacks.append(fallback)
        if work.trace is not None:
            work.trace.event("gateway.fallback", _fallback_attributes(fallback))
        return True


def _queued(work: Work, route: ModelRoute, outcome: str, waited_s: float) -> None:
    """A traced request's wait in `route`'s queue, ended now with `outcome`."""
    if work.trace is not None:
        waited: dict[str, Attribute] = {
            "gateway.model": route.name,
            "gateway.priority": work.priority,
            "gateway.queue.outcome": outcome,
        }
        work.trace.step("gateway.queue", time.monotonic() - waited_s, waited)


def _model_span(trace: RequestTrace, route: ModelRoute, index: int) -> Span:
    """The span of the chain's model `index` taking the work (its queue and its replica
    calls under it), made the current step."""
    attributes: dict[str, Attribute] = {"gateway.model": route.name, "gateway.chain_index": index}
    span = trace.child(f"gateway.model {route.name}", attributes, parent=trace.span)
    trace.enter(span)
    return span


def _end_model_span(span: Span, outcome: str, *, failed: bool = False) -> None:
    """A model's turn is over: served, or moved on or failed for `outcome`."""
    tracing.end_span(span, outcome if failed else None, {"gateway.model.outcome": outcome})


def _fallback_attributes(fallback: Fallback) -> dict[str, Attribute]:
    return {
        "gateway.fallback.source": fallback.source,
        "gateway.fallback.target": fallback.target,
        "gateway.fallback.reason": fallback.reason.value,
    }


def _falls_back_for(work: Work, index: int, route: ModelRoute, reason: FallbackReason) -> bool:
    """Whether the chain's model `index` (`route`) hands the work on for `reason`: it is
    not the last, and `reason` is one of its `fallback_on`."""
    return index + 1 < len(work.chain) and reason in route.config.fallback_on


def _learn_slow_start(route: ModelRoute, call: UpstreamCall, waited_s: float) -> None:
    """A stream with no first piece after `waited_s`: its TTFT is at least that.

    A lower bound only ever raises the model's expected TTFT (for this prompt's size),
    so the predicted wait learns that a model turned slow even though its requests time
    out instead of finishing; a short wait (a tight deadline) teaches nothing.
    """
    latency = route.resilience.latency
    if waited_s > latency.expected_s(True, 0, call.prompt_estimate):
        latency.observe(waited_s, waited_s, 0, call.prompt_estimate)


def _learn_too_slow(route: ModelRoute, work: Work, call: UpstreamCall, waited_s: float) -> None:
    """A whole answer still missing after `waited_s`: a lower bound, as in
    `_learn_slow_start`, when it exceeds what the model is expected to take.

    Counted as if it would have run to `max_tokens`, which gives a time per token no
    larger than the real one (the answer had at most that many tokens, and took longer).
    """
    latency = route.resilience.latency
    max_tokens, prompt_tokens = work.request.params.max_tokens, call.prompt_estimate
    if waited_s <= latency.expected_s(False, max_tokens, prompt_tokens):
        return
    if max_tokens > 1:
        latency.observe(None, waited_s, max_tokens, prompt_tokens)
    else:
        latency.observe(waited_s, waited_s, max_tokens, prompt_tokens)


class _Rest(AsyncGenerator[Delta, None]):
    """The rest of a stream after its first piece; holds the admission slot, and is
    bounded by the request's deadline.

    The slot goes back once (with the tokens seen), at the first of: the stream ends or
    fails, `aclose` (even before any iteration), the deadline. The deadline is one timer
    per stream: if it passes while the reader waits for a piece, that wait is cancelled
    (which cancels the upstream request) and UpstreamTimeout raised in its place; if it
    passes between pieces, the slot goes back at once and the next read raises it. A
    cancel of the reader's task from anywhere else passes through untouched.
    """

    __slots__ = (
        "_admission",
        "_cancelling",
        "_deltas",
        "_ended",
        "_expired",
        "_loop",
        "_meter",
        "_prompt_tokens",
        "_reader",
        "_route",
        "_slot",
        "_span",
        "_started",
        "_timer",
        "_ttft",
    )

    def __init__(
        self,
        admission: AdmissionController,
        slot: Slot,
        route: ModelRoute,
        call: UpstreamCall,
        first: Delta | None,
        deltas: AsyncGenerator[Delta, None],
        started: float,
        ttft: float,
        deadline: float,
        span: Span | None = None,
    ) -> None:
        self._admission = admission
        # The model's span, ended with the stream.
        self._span = span
        self._slot = slot
        self._route = route
        self._prompt_tokens = call.prompt_estimate
        self._deltas = deltas
        self._started = started
        self._ttft = ttft
        self._meter = UsageMeter()
        self._expired = False
        self._ended = False
        # The task waiting in __anext__, while one is.
        self._reader: asyncio.Task[Any] | None = None
        # Its cancel requests before the deadline timer added one.
        self._cancelling = 0
        self._timer: asyncio.TimerHandle | None = None
        # The stream's loop, for `current_task` on every piece: asking it for the running
        # loop instead costs about 0.3 µs a piece.
        self._loop = asyncio.get_running_loop()
        if first is None:
            # Failover's stream has returned: nothing more will come.
            self._end(observe=True)
            return
        self._meter.add(first)
        self._timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._expire)

    def __aiter__(self) -> _Rest:
        return self

    async def __anext__(self) -> Delta:
        if self._expired:
            self._expired = False  # reported once; then the stream is just over
            await self.aclose()
            raise self._timeout()
        if self._ended:
            raise StopAsyncIteration
        reader = self._reader = asyncio.current_task(self._loop)
        try:
            delta = await anext(self._deltas)
        except BaseException as exc:
            self._reader = None
            # `_expired` now means the deadline timer cancelled this read. Only its cancel
            # (no other one pending) becomes the timeout; the upstream generator is closed
            # by it, and the request with it.
            if self._expired and reader is not None and reader.uncancel() <= self._cancelling:
                self._expired = False  # reported once; then the stream is just over
                self._end(observe=True)
                cause = None if isinstance(exc, asyncio.CancelledError) else exc
                raise self._timeout() from cause
            self._end(observe=isinstance(exc, StopAsyncIteration))
            raise
        self._reader = None
        if self._expired and reader is not None:
            reader.uncancel()  # the upstream swallowed the cancel; the next read times out
        self._meter.add(delta)
        return delta

    async def asend(self, value: None) -> Delta:
        return await self.__anext__()

    async def athrow(
        self,
        typ: type[BaseException] | BaseException,
        val: object = None,
        tb: TracebackType | None = None,
    ) -> Delta:
        """Close the stream, then raise the exception given."""
        await self.aclose()
        if isinstance(typ, BaseException):
            raise typ
        if isinstance(val, BaseException):
            raise val
        raise typ() if val is None else typ(val)

    async def aclose(self) -> None:
        """Cancel the upstream request, if still open, and give the slot back."""
        try:
            await self._deltas.aclose()
        finally:
            self._end(observe=False)

    def _expire(self) -> None:
        """The deadline timer."""
        self._timer = None
        self._expired = True
        reader = self._reader
        if reader is not None:
            self._cancelling = reader.cancelling()
            reader.cancel()  # __anext__ turns it into UpstreamTimeout
        else:
            # Between pieces (the reader is busy with the last one, or went away without
            # closing): the stream is over, whenever the next read or aclose comes.
            self._end(observe=True)

    def _timeout(self) -> UpstreamTimeout:
        return DeadlineCut(f"{self._route.name} did not finish before the request deadline")

    def _end(self, *, observe: bool) -> None:
        """Give the slot back (once) with the tokens seen; when `observe`, record the
        stream's latency (it ended, or was cut at the deadline: either way a real sample
        of its time per token)."""
        if self._ended:
            return
        self._ended = True
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        meter = self._meter
        if self._span is not None:
            self._span.set_attribute("gen_ai.usage.output_tokens", meter.completion_tokens)
            _end_model_span(self._span, "served")
        if observe:
            self._route.resilience.latency.observe(
                self._ttft,
                time.monotonic() - self._started,
                meter.completion_tokens,
                self._prompt_tokens,
            )
        self._admission.release(self._slot, meter.usage(0).total_tokens)
