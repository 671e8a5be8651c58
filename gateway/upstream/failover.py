"""Send a request to a replica, and to another one when the first cannot take it.

A request moves to another replica only while nothing has been generated for it, so a
client never sees output twice. Each move, once there is a replica to move to, waits an
exponential backoff with full jitter and spends from the model's retry budget, so a
fleet-wide failure does not turn into a retry storm. Replicas are chosen under the
model's `max_in_flight_per_replica`. Refusals, backend timeouts and streams with no
first piece within the model's first-token budget count as the replica's failures for
outlier ejection; cancellations do not.

A late first token is the replica's fault for certain only for a short prompt: at most
`SHORT_PROMPT_TOKENS` (estimated), and a budget mostly the model's base
(`first_token_per_prompt_token_s` x its tokens at most `first_token_s`). A longer
prompt's prefill grows with its real size, which the estimate may miss (unusual text,
a slower replica for long contexts), so its timeout counts only against a replica that
is failing already (`OutlierDetector.record_failure(doubtful=True)`): a tenant's long
prompts cannot eject replicas that answer everyone else, and a hung replica, which
fails short requests too, is still ejected.

`Timeout` is `asyncio.timeout` as a plain context manager, at about half the cost: the
first-token budget here and a whole answer's deadline in the dispatcher use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from types import TracebackType

from gateway.backends.base import ReplicaUnavailable, UpstreamError, UpstreamTimeout
from gateway.config import RoutingPolicy
from gateway.inference.types import Completion, Delta, UpstreamCall, Usage, UsageMeter
from gateway.observability import metrics, tracing
from gateway.upstream.affinity import routing_key
from gateway.upstream.outlier import ReplicaState
from gateway.upstream.pool import Replica
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.failover")

# Of what an upstream said, the part logged: a failure must not flood the log.
_DETAIL_MAX = 4000

# Prompts up to this many estimated tokens (4 KB of English, 800 CJK characters) are
# prefilled well within any first-token budget: their timeouts are the replica's fault.
SHORT_PROMPT_TOKENS = 1024


class NoReplicaLeft(Exception):
    """Every replica tried was unavailable, none was healthy, or the retry budget ran out."""

    def __init__(self, model: str, last_error: Exception | None) -> None:
        detail = f": {last_error}" if last_error else ""
        super().__init__(f"no replica of {model} could take the request{detail}")
        self.last_error = last_error


class _Attempts:
    """The replicas to try in turn, each chosen by the model's routing policy (`ReplicaPool.
    choose`) among the available ones not yet tried and under their in-flight cap; before
    each retry, once there is a replica to retry on, the budget is asked and the backoff
    waited.

    `first` is synchronous and `retry` is awaited only after a failure: the usual request,
    served by its first replica, costs no async generator (its WeakSet entry, its
    `aclose`) and no coroutine for the choice.
    """

    __slots__ = ("_available", "_cap", "_deadline", "_first_by", "_key", "_route", "_tried")

    def __init__(
        self, route: ModelRoute, call: UpstreamCall, deadline: float, first_by: float | None
    ) -> None:
        routing = route.config.routing
        self._key = (
            routing_key(call, routing) if routing.policy is RoutingPolicy.CACHE_AWARE else None
        )
        self._route = route
        self._deadline = deadline
        self._first_by = first_by
        self._available = route.resilience.outlier.available
        self._cap = route.config.queue.max_in_flight_per_replica
        self._tried: list[Replica] = []
        route.resilience.budget.record_request()

    def first(self) -> Replica | None:
        """The first replica to try; None when none can take the request."""
        route = self._route
        if route.config.max_attempts < 1:
            return None
        choice = route.pool.choose((), self._available, self._cap, self._key)
        replica = choice.replica
        if replica is None:
            return None
        if choice.skipped is not None:
            metrics.ROUTING_SKIPS.labels(route.name, choice.skipped.value).inc()
        self._tried.append(replica)
        return replica

    @property
    def count(self) -> int:
        """Replicas tried so far, the one being tried included."""
        return len(self._tried)

    async def retry(self) -> Replica | None:
        """The next replica to try, after its backoff; None when no replica is left, the
        budget says no, or the backoff would end past the deadline. Raises TimeoutError
        when it would end past `first_by` (a stream's first-token time) instead."""
        route, tried = self._route, self._tried
        if len(tried) >= route.config.max_attempts:
            return None
        available, cap, key = self._available, self._cap, self._key
        choice = route.pool.choose(tried, available, cap, key)
        if choice.replica is None:
            return None  # nothing to retry on: no budget spent, no backoff waited
        if choice.skipped is not None:
            metrics.ROUTING_SKIPS.labels(route.name, choice.skipped.value).inc()
        resilience = route.resilience
        delay = resilience.backoff.delay(len(tried) - 1)
        resume = time.monotonic() + delay
        if resume >= self._deadline:
            return None
        if self._first_by is not None and resume >= self._first_by:
            raise TimeoutError  # as if the first-token timeout had cut the backoff short
        if not resilience.budget.try_spend():
            metrics.RETRY_BUDGET_EXHAUSTED.labels(route.name).inc()
            return None
        metrics.RETRIES.labels(route.name).inc()
        await asyncio.sleep(delay)
        # Picked again after the backoff, with fresh load figures; the caller leases it
        # at once (the outlier detector's single half-open probe relies on that).
        replica = route.pool.pick(tried, available, cap, key)
        if replica is not None:
            tried.append(replica)
        return replica


async def complete(route: ModelRoute, call: UpstreamCall, deadline: float) -> Completion:
    """Run `call` to completion on the least-loaded replica, failing over if it is down.

    A replica that times out (the backend's own timeout) counts as failing; the request
    is not moved, as its time is mostly spent. Cancelling (the gateway's deadline, or the
    client leaving) counts against no replica.
    """
    last_error: Exception | None = None
    attempts = _Attempts(route, call, deadline, None)
    trace = tracing.current()
    replica = attempts.first()
    while replica is not None:
        with route.pool.lease(replica), _traced(trace, route, replica, attempts) as traced:
            try:
                completion = await route.backend.complete(replica.url, call)
            except UpstreamError as exc:
                if traced is not None:
                    traced.failed(exc)
                if not _moves_on(route, replica, exc):
                    raise
                last_error = exc
            else:
                route.resilience.outlier.record_success(replica)
                _served(route, replica, completion.usage)
                return completion
        replica = await attempts.retry()
    raise NoReplicaLeft(route.name, last_error)


async def stream(
    route: ModelRoute, call: UpstreamCall, deadline: float, first_by: float | None = None
) -> AsyncGenerator[Delta, None]:
    """Stream `call` from the least-loaded replica; fail over until the first piece arrives.

    `first_by` (monotonic seconds) bounds the wait for the first piece, backoffs
    included: past it, TimeoutError. A replica that sent nothing by then counts as
    failing (`_slow_start`) when the budget was the model's own, not a request deadline
    shorter than it; for a long prompt (`_long_prompt`) only if it is failing already.
    Backend timeouts count as failures too.
    The replica stays leased until the stream ends or is closed.
    """
    last_error: Exception | None = None
    outlier = route.resilience.outlier
    attempts = _Attempts(route, call, deadline, first_by)
    trace = tracing.current()
    replica = attempts.first()
    while replica is not None:
        with route.pool.lease(replica), _traced(trace, route, replica, attempts) as traced:
            upstream = route.backend.stream(replica.url, call)
            asked = time.monotonic()
            try:
                try:
                    with Timeout(None if first_by is None else first_by - asked):
                        first = await anext(upstream)
                except StopAsyncIteration:
                    outlier.record_success(replica)
                    _served(route, replica, Usage())
                    return
                except UpstreamError as exc:
                    if traced is not None:
                        traced.failed(exc)
                    if not _moves_on(route, replica, exc):
                        raise
                    last_error = exc  # and on to the next replica
                except TimeoutError:
                    if _slow_start(route, call, deadline, first_by, asked):
                        _failed(route, replica, doubtful=_long_prompt(route, call))
                    raise
                else:
                    if traced is not None:
                        traced.first_piece()
                    outlier.record_success(replica)
                    meter = UsageMeter()
                    meter.add(first)
                    yield first
                    try:
                        async for delta in upstream:
                            meter.add(delta)
                            yield delta
                    except UpstreamError as exc:
                        _log_failure(route, replica, exc)
                        if isinstance(exc, ReplicaUnavailable | UpstreamTimeout):
                            # Died or hung mid-stream: too late to move this request, not
                            # too late to spare others.
                            _failed(route, replica)
                        raise
                    finally:
                        _served(route, replica, meter.usage(0))
                    return
            finally:
                await upstream.aclose()
        replica = await attempts.retry()
    raise NoReplicaLeft(route.name, last_error)


# What `_traced` gives for a request that is not traced: one shared, reusable block.
_UNTRACED: contextlib.nullcontext[None] = contextlib.nullcontext()


def _traced(
    trace: tracing.RequestTrace | None, route: ModelRoute, replica: Replica, attempts: _Attempts
) -> contextlib.AbstractContextManager[tracing.UpstreamAttempt | None]:
    """The call to `replica` as a span of `trace` (nothing when it is None)."""
    if trace is None:
        return _UNTRACED
    return trace.upstream(route.name, replica.url, route.config.backend.value, attempts.count)


def _moves_on(route: ModelRoute, replica: Replica, exc: UpstreamError) -> bool:
    """A replica's failure before any output, whole answers and streams alike: logged,
    held against the replica if it is its fault (it could not take the request, or timed
    out), and whether the request may move to another replica (only if nothing was
    generated: `ReplicaUnavailable`)."""
    _log_failure(route, replica, exc)
    if isinstance(exc, ReplicaUnavailable | UpstreamTimeout):
        _failed(route, replica)
    return isinstance(exc, ReplicaUnavailable)


def _slow_start(
    route: ModelRoute, call: UpstreamCall, deadline: float, first_by: float | None, asked: float
) -> bool:
    """Whether a replica that sent no first piece by `first_by` is to blame: the wait was
    cut by the model's first-token budget for this prompt (not by a request deadline
    shorter than it), and this attempt had at least half of that budget (not just what a
    retry had left)."""
    if first_by is None or first_by >= deadline:
        return False
    return first_by - asked >= route.config.timeouts.first_token_budget(call.prompt_estimate) / 2


def _long_prompt(route: ModelRoute, call: UpstreamCall) -> bool:
    """Whether `call`'s prompt may explain its late first token: more than
    `SHORT_PROMPT_TOKENS`, or a first-token budget more its allowance than the base."""
    timeouts, tokens = route.config.timeouts, call.prompt_estimate
    return (
        tokens > SHORT_PROMPT_TOKENS
        or timeouts.first_token_per_prompt_token_s * tokens > timeouts.first_token_s
    )


def _served(route: ModelRoute, replica: Replica, usage: Usage) -> None:
    """Count what the replica did: requests, the tokens it produced (its effective
    throughput), and its prompt tokens and the share its prefix cache held."""
    name, url = route.name, replica.url
    metrics.labels(metrics.REPLICA_REQUESTS, name, url).inc()
    metrics.labels(metrics.REPLICA_TOKENS, name, url).inc(usage.completion_tokens)
    if usage.cached_tokens is not None:  # only replicas that report their cache
        metrics.labels(metrics.REPLICA_PROMPT_TOKENS, name, url).inc(usage.prompt_tokens)
        metrics.labels(metrics.REPLICA_CACHED_TOKENS, name, url).inc(usage.cached_tokens)


def _log_failure(route: ModelRoute, replica: Replica, exc: UpstreamError) -> None:
    """Log what went wrong, in the library's, the upstream's or the model's own words
    (`exc.detail`): the client is told only the kind of failure (`str(exc)`)."""
    log.warning(
        "upstream failure: %s",
        exc.detail[:_DETAIL_MAX],
        extra={
            "fields": {
                "event": "upstream_error",
                "model": route.name,
                "replica": replica.url,
                "error": type(exc).__name__,
            }
        },
    )


def _failed(route: ModelRoute, replica: Replica, *, doubtful: bool = False) -> None:
    """Tell the outlier detector (`doubtful`: see `OutlierDetector.record_failure`), and
    count an ejection when this failure caused one."""
    outlier = route.resilience.outlier
    before = outlier.state(replica)
    outlier.record_failure(replica, doubtful=doubtful)
    if outlier.state(replica) is ReplicaState.EJECTED and before is not ReplicaState.EJECTED:
        metrics.REPLICA_EJECTIONS.labels(route.name, replica.url).inc()
        log.warning(
            "replica ejected",
            extra={"fields": {"event": "ejection", "model": route.name, "replica": replica.url}},
        )


class Timeout:
    """Cancel the block's task `delay` seconds from now (None: never); TimeoutError if
    that is what ended it. For one `with` block, in a task.

    `asyncio.timeout` at about half its cost, for the request path. `asyncio.timeout` is
    an asynchronous context manager: entering and leaving it awaits two coroutines, and
    it looks the running loop up twice and the current task once, about 3.3 µs a use
    under uvloop, of which the timer itself (`call_at`, `cancel`) is 1.3. The request
    path uses one per request (the deadline of a whole answer, the first-token budget
    of a stream), so this does the same with a plain context manager (`with`, which an
    async function may use: nothing here needs to await).

    The semantics are those of Python 3.11's `asyncio.Timeout`: on expiry the task is
    cancelled; leaving the block after that takes the cancel back (`Task.uncancel`)
    and, when no other cancel came since the block was entered and the cancel did end
    the block, raises TimeoutError from the CancelledError. A cancel from anywhere else
    passes through untouched.
    """

    __slots__ = ("_cancelling", "_delay", "_expired", "_handle", "_task")

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._expired = False
        self._handle: asyncio.Handle | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def __enter__(self) -> Timeout:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        delay = self._delay
        if delay is not None:
            # As asyncio.timeout: a deadline on the loop's clock, due now if already past.
            when = loop.time() + delay
            if when <= loop.time():
                self._handle = loop.call_soon(self._expire)
            else:
                self._handle = loop.call_at(when, self._expire)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        handle = self._handle
        if handle is not None:
            self._handle = None
            handle.cancel()
        if self._expired:
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _expire(self) -> None:
        assert self._task is not None
        self._handle = None
        self._task.cancel()
        self._expired = True
