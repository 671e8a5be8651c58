"""From an admitted request to upstream output: queueing, deadlines and the fallback chain.

For each model of the request's chain (the model asked for, then its fallbacks that the
tenant may use) the dispatcher:

1. routes to the next model up front when the predicted wait (queue ahead over the
   measured drain rate) plus the model's usual latency would miss the deadline;
2. waits for a slot in the model's admission queue (priority, fair share), or moves on
   when the queue is full;
3. calls the model (retrying on other replicas before any output); a stream that has
   not produced its first token within `timeouts.first_token_s` is cancelled upstream
   and the next model is tried.

Each move is recorded as a `Fallback`, which the response reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from gateway.admission import AdmissionController, DeadlineExceeded, Overloaded, Slot
from gateway.backends.base import UpstreamError
from gateway.config import FallbackReason
from gateway.inference import Completion, Delta, InferenceRequest, UpstreamCall, UsageMeter
from gateway.observability import metrics
from gateway.resilience import failover
from gateway.resilience.failover import NoReplicaLeft
from gateway.routes import ModelRoute


class DeadlineMissed(Exception):
    """No model of the chain could answer before the request's deadline."""


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
        if not self.fallbacks:
            return None
        path = "->".join([self.fallbacks[0].source, *(f.target for f in self.fallbacks)])
        return f"{path}; reason={self.fallbacks[-1].reason.value}"


@dataclass(frozen=True, slots=True)
class Job:
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


class Dispatcher:
    """Runs jobs through admission and the fallback chain."""

    def __init__(self, admission: AdmissionController) -> None:
        self._admission = admission

    async def complete(self, job: Job) -> tuple[Completion, Served]:
        """The whole answer, from the first model of the chain that can give it in time."""
        fallbacks: list[Fallback] = []
        for index, route in enumerate(job.chain):
            slot = await self._admit(job, index, fallbacks)
            if slot is None:
                continue
            call = job.first_call if index == 0 else route.upstream_call(job.request)
            started = time.monotonic()
            used = 0
            try:
                # asyncio.timeout, unlike wait_for, runs the call in this task: no new task.
                async with asyncio.timeout(job.deadline - started):
                    completion = await failover.complete(route, call, job.deadline)
            except TimeoutError:
                raise DeadlineMissed(f"{route.name} did not answer before the deadline") from None
            except NoReplicaLeft:
                if self._may_fall_back(job, index, FallbackReason.REPLICA_ERROR, fallbacks):
                    continue
                raise
            else:
                used = completion.usage.total_tokens
                route.resilience.latency.observe(
                    None, time.monotonic() - started, completion.usage.completion_tokens
                )
                return completion, Served(route, fallbacks, slot.waited_s)
            finally:
                self._admission.release(slot, used)
        raise DeadlineMissed("no model of the fallback chain could take the request in time")

    async def stream(self, job: Job) -> tuple[Delta | None, AsyncGenerator[Delta, None], Served]:
        """The first piece of the answer, the rest of it, and who serves it.

        The stream holds its admission slot until it ends or is closed.
        """
        fallbacks: list[Fallback] = []
        for index, route in enumerate(job.chain):
            slot = await self._admit(job, index, fallbacks)
            if slot is None:
                continue
            call = job.first_call if index == 0 else route.upstream_call(job.request)
            started = time.monotonic()
            deltas = failover.stream(route, call, job.deadline)
            budget = min(route.config.timeouts.first_token_s, job.deadline - started)
            try:
                first: Delta | None
                async with asyncio.timeout(budget):
                    first = await anext(deltas)
            except StopAsyncIteration:
                first = None
            except TimeoutError:
                await deltas.aclose()  # cancels the upstream request
                self._admission.release(slot, 0)
                if self._may_fall_back(job, index, FallbackReason.TTFT_TIMEOUT, fallbacks):
                    continue
                raise DeadlineMissed(f"no first token from {route.name} in time") from None
            except (UpstreamError, NoReplicaLeft):
                await deltas.aclose()
                self._admission.release(slot, 0)
                if self._may_fall_back(job, index, FallbackReason.REPLICA_ERROR, fallbacks):
                    continue
                raise
            ttft = time.monotonic() - started
            metrics.labels(metrics.TTFT, route.name).observe(ttft)
            served = Served(route, fallbacks, slot.waited_s, ttft)
            return first, self._hold(slot, route, first, deltas, started, ttft), served
        raise DeadlineMissed("no model of the fallback chain could take the request in time")

    async def _hold(
        self,
        slot: Slot,
        route: ModelRoute,
        first: Delta | None,
        deltas: AsyncGenerator[Delta, None],
        started: float,
        ttft: float,
    ) -> AsyncGenerator[Delta, None]:
        """The rest of a stream, releasing its slot (with the work done) when it ends."""
        meter = UsageMeter()
        if first is not None:
            meter.add(first)
        try:
            async for delta in deltas:
                meter.add(delta)
                yield delta
            route.resilience.latency.observe(
                ttft, time.monotonic() - started, meter.completion_tokens
            )
        finally:
            await deltas.aclose()
            self._admission.release(slot, meter.usage(0).total_tokens)

    async def _admit(self, job: Job, index: int, fallbacks: list[Fallback]) -> Slot | None:
        """A slot on the chain's model `index`, or None when the job moves on."""
        route = job.chain[index]
        remaining = job.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineMissed("the deadline passed before a model could take the request")
        predicted = self._admission.predicted_wait_s(
            route.name, job.priority
        ) + route.resilience.latency.expected_s(job.request.stream, job.request.params.max_tokens)
        if predicted > remaining and self._may_fall_back(
            job, index, FallbackReason.PREDICTED_WAIT, fallbacks
        ):
            return None
        try:
            return await self._admission.acquire(
                route.name,
                job.tenant,
                priority=job.priority,
                cost_tokens=job.cost_tokens,
                share=job.share,
                deadline=job.deadline,
            )
        except DeadlineExceeded:
            raise DeadlineMissed(f"still queued for {route.name} at the deadline") from None
        except Overloaded:
            if self._may_fall_back(job, index, FallbackReason.QUEUE_FULL, fallbacks):
                return None
            raise

    @staticmethod
    def _may_fall_back(
        job: Job, index: int, reason: FallbackReason, fallbacks: list[Fallback]
    ) -> bool:
        """Whether the job moves to the next model for `reason` (and record it if so)."""
        route = job.chain[index]
        if index + 1 >= len(job.chain) or reason not in route.config.fallback_on:
            return False
        fallbacks.append(Fallback(route.name, job.chain[index + 1].name, reason))
        return True
