"""The admission controller: per model, which waiting request goes upstream next.

Each model has a bounded queue and a cap on requests in flight (slots). A request takes a
slot at once when one is free and nobody waits; otherwise it queues, in its priority
class, behind higher classes, in fair-share order within its class
(`gateway.admission.fairshare`). A full queue refuses at once, or sheds the newest
request of a lower class to make room. Queued requests leave at their deadline or when
cancelled. Everything here is synchronous bookkeeping plus one future per waiter: no I/O,
no polling, no locks (it runs on one event loop).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from gateway.admission.drain import DrainMeter
from gateway.admission.errors import DeadlineExceeded, Overloaded, Shed
from gateway.admission.fairshare import FairQueue, QueuePlace
from gateway.observability import metrics

DEFAULT_CLASSES = ("online", "batch")
# The class of the Batch APIs' lines (`gateway.batches`): below every configured one, so
# that they take only the slots online traffic leaves free. Configs may not name it.
BATCH_API_CLASS = "batch-api"


class Timer(Protocol):
    """A scheduled callback that can be called off (`asyncio.TimerHandle` is one)."""

    def cancel(self) -> None: ...


# call_later(delay_s, callback): how deadlines are timed; tests pass a fake clock's.
CallLater = Callable[[float, Callable[[], None]], Timer]


def _loop_call_later(delay: float, callback: Callable[[], None]) -> Timer:
    return asyncio.get_running_loop().call_later(delay, callback)


# Not frozen: `release` marks it released, and the caller may fill in `actual_tokens`.
@dataclass(eq=False, slots=True)
class Slot:
    """A granted place upstream, held until `release`.

    `waited_s` is the time spent queued (0 on the fast path). Set `actual_tokens` before
    leaving `AdmissionController.admit`'s block to correct the fair share by real usage;
    left unset, the estimate stands.
    """

    model: str
    tenant: str
    priority: str
    share: float
    cost_tokens: int
    waited_s: float
    # When it was granted (the controller's clock): its hold time is the service time
    # the closed loop sizes replicas by.
    granted_at: float = 0.0
    actual_tokens: int | None = None
    released: bool = field(default=False, init=False)


@dataclass(frozen=True, slots=True)
class ClassDemand:
    """One priority class of one model, for the closed loop: requests that asked for a
    slot since start (refused ones too) and the tokens they reserved (`cost_tokens`: a
    request with `n` choices is `n` requests), and now, the tokens of the requests
    waiting and the slots held."""

    arrivals: int = 0
    tokens: int = 0
    queued_tokens: int = 0
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """One model's admission state, for metrics and tests."""

    queued: Mapping[str, int]  # by priority class, highest first
    in_flight: int
    capacity: int
    drain_rate: float | None  # completions per second while saturated; None: not measured
    served_tokens: Mapping[str, int]  # actual tokens by tenant, since start
    # Since start: requests that asked for a slot (refused ones too: demand not met is
    # demand), slots given back, and the seconds slots were held in all.
    arrivals: int = 0
    completions: int = 0
    busy_s: float = 0.0
    # By priority class (highest first): what the closed loop weighs demand by.
    by_class: Mapping[str, ClassDemand] = field(default_factory=dict)
    # Since start: the tokens the released slots had reserved (their `cost_tokens`).
    completed_tokens: int = 0
    # Since start: requests of a higher class that waited in the queue while a batch line
    # took a slot after they queued (0 by construction: the queue grants by class).
    delayed_by_batch: int = 0


@dataclass(eq=False, slots=True)
class _ClassCounts:
    """`ClassDemand`, as it is counted."""

    arrivals: int = 0
    tokens: int = 0
    queued_tokens: int = 0
    in_flight: int = 0


@dataclass(eq=False, slots=True)
class _Waiter:
    """A queued request: the future its `acquire` awaits, and its deadline timer."""

    tenant: str
    priority: int
    share: float
    cost: int
    arrived: float
    deadline: float | None
    future: asyncio.Future[Slot]
    place: QueuePlace[_Waiter] | None = None
    timer: Timer | None = None


class _Model:
    """The admission state of one model."""

    __slots__ = (
        "arrivals",
        "batch_granted_at",
        "busy_s",
        "by_class",
        "capacity",
        "classes",
        "completed_tokens",
        "completions",
        "delayed_by_batch",
        "drain",
        "in_flight",
        "max_queued",
        "name",
        "queued",
        "served",
    )

    def __init__(
        self, name: str, classes: int, max_queued: int, capacity: Callable[[], int], window: int
    ) -> None:
        self.name = name
        self.max_queued = max_queued
        self.capacity = capacity
        self.classes: list[FairQueue[_Waiter]] = [FairQueue() for _ in range(classes)]
        self.queued = 0  # across classes; kept so the fast path need not sum them
        self.in_flight = 0
        self.drain = DrainMeter(window)
        self.served: dict[str, int] = {}
        self.arrivals = 0
        self.completions = 0
        self.busy_s = 0.0
        self.by_class = [_ClassCounts() for _ in range(classes)]
        self.completed_tokens = 0
        # When a batch line last took a slot, and the waiters granted after it that had
        # queued before it (see `ModelSnapshot.delayed_by_batch`).
        self.batch_granted_at = -math.inf
        self.delayed_by_batch = 0


class AdmissionController:
    """Queue-depth admission, strict priority classes and weighted fair share, per model.

    `classes` are the priority class names, highest first. `clock` (monotonic seconds)
    and `call_later` must agree; the defaults are the event loop's. Before a model's
    drain rate has been measured, any wait that is not zero is estimated at
    `default_wait_s`; a retry-after is never more than `max_retry_after_s`.
    """

    def __init__(
        self,
        classes: Sequence[str] = DEFAULT_CLASSES,
        *,
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater = _loop_call_later,
        default_wait_s: float = 1.0,
        max_retry_after_s: float = 60.0,
        drain_window: int = 32,
    ) -> None:
        if not classes or len(set(classes)) != len(classes):
            raise ValueError(f"priority classes must be distinct and not empty: {classes!r}")
        self.classes = tuple(classes)
        self._index = {name: i for i, name in enumerate(self.classes)}
        self._batch_class = self._index.get(BATCH_API_CLASS, -1)
        self._clock = clock
        self._call_later = call_later
        self._default_wait_s = default_wait_s
        self._max_retry_after_s = max_retry_after_s
        self._drain_window = drain_window
        self._models: dict[str, _Model] = {}

    def configure_model(self, model: str, max_queued: int, capacity: Callable[[], int]) -> None:
        """Set (or change) a model's queue bound and its slot count.

        `capacity` is called whenever slots are counted, so it can follow the healthy
        replicas (max_in_flight_per_replica x healthy replicas). Reconfiguring keeps the
        queue and the requests in flight; a smaller bound sheds nothing already queued.
        """
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, not {max_queued}")
        state = self._models.get(model)
        if state is None:
            metrics.labels(metrics.ONLINE_DELAYED_BY_BATCH, model)  # shown at 0
            self._models[model] = _Model(
                model, len(self.classes), max_queued, capacity, self._drain_window
            )
        else:
            state.max_queued = max_queued
            state.capacity = capacity
            self.capacity_changed(model)

    async def acquire(
        self,
        model: str,
        tenant: str,
        *,
        priority: str,
        cost_tokens: int,
        share: float = 1.0,
        deadline: float | None = None,
    ) -> Slot:
        """Wait for a slot of `model`; the caller must `release` it (or use `admit`).

        Returns at once when a slot is free and nothing is queued. `cost_tokens` is the
        estimated work in tokens; `deadline` an absolute time on the controller's clock by
        which the request must have left the queue. Raises `Overloaded` when the queue is
        full, `Shed` when evicted for a higher class, `DeadlineExceeded` at the deadline
        (at once if it has passed and the request would have to queue). A cancelled wait
        leaves the queue, and gives back a slot granted meanwhile.
        """
        state = self._models[model]
        cls = self._index[priority]
        if not share > 0 or cost_tokens < 0:
            raise ValueError(f"share must be > 0, cost_tokens >= 0: {share}, {cost_tokens}")
        state.arrivals += 1
        counts = state.by_class[cls]
        counts.arrivals += 1
        counts.tokens += cost_tokens
        if state.queued == 0:
            capacity = state.capacity()
            if state.in_flight < capacity:
                return self._grant_now(state, tenant, cls, share, cost_tokens, capacity)
        return await self._queue(state, tenant, cls, share, cost_tokens, deadline)

    @asynccontextmanager
    async def admit(
        self,
        model: str,
        tenant: str,
        *,
        priority: str,
        cost_tokens: int,
        share: float = 1.0,
        deadline: float | None = None,
    ) -> AsyncIterator[Slot]:
        """`acquire` for the length of a block; released on the way out, however it ends."""
        slot = await self.acquire(
            model,
            tenant,
            priority=priority,
            cost_tokens=cost_tokens,
            share=share,
            deadline=deadline,
        )
        try:
            yield slot
        finally:
            actual = slot.actual_tokens
            self.release(slot, slot.cost_tokens if actual is None else actual)

    def release(self, slot: Slot, actual_tokens: int) -> None:
        """Give the slot back, charge the tenant its actual tokens, admit the next waiter.

        Releasing a slot again does nothing.
        """
        if slot.released:
            return
        slot.released = True
        state = self._models[slot.model]
        state.in_flight -= 1
        state.by_class[self._index[slot.priority]].in_flight -= 1
        state.completed_tokens += slot.cost_tokens
        state.served[slot.tenant] = state.served.get(slot.tenant, 0) + actual_tokens
        if actual_tokens != slot.cost_tokens:
            state.classes[self._index[slot.priority]].correct(
                slot.tenant, slot.share, actual_tokens - slot.cost_tokens
            )
        now = self._clock()
        state.completions += 1
        state.busy_s += now - slot.granted_at
        state.drain.completed(now)
        self._dispatch(state, now)

    def capacity_changed(self, model: str) -> None:
        """Admit waiters into slots that appeared (replicas came back); call after a change."""
        state = self._models[model]
        self._dispatch(state, self._clock())

    def predicted_wait_s(self, model: str, priority: str) -> float:
        """How long a request of `priority` arriving now would queue, from the drain rate.

        It needs as many completions as there are requests queued in its class and above,
        plus requests in flight beyond the slots, plus one for its own slot: 0 when a slot
        is free and nothing is queued, infinite while the model has no slots at all.
        """
        state = self._models[model]
        return self._wait_s(state, self._index[priority], self._clock())

    def snapshot(self, model: str) -> ModelSnapshot:
        """Queued requests by class, requests in flight, slots, drain rate, tokens served."""
        state = self._models[model]
        return ModelSnapshot(
            queued={name: len(q) for name, q in zip(self.classes, state.classes, strict=True)},
            in_flight=state.in_flight,
            capacity=state.capacity(),
            drain_rate=state.drain.rate(self._clock()),
            served_tokens=dict(state.served),
            arrivals=state.arrivals,
            completions=state.completions,
            busy_s=state.busy_s,
            by_class={
                name: ClassDemand(c.arrivals, c.tokens, c.queued_tokens, c.in_flight)
                for name, c in zip(self.classes, state.by_class, strict=True)
            },
            completed_tokens=state.completed_tokens,
            delayed_by_batch=state.delayed_by_batch,
        )

    # -- internals ------------------------------------------------------------------------

    def _grant_now(
        self, state: _Model, tenant: str, cls: int, share: float, cost: int, capacity: int
    ) -> Slot:
        """The fast path: a free slot and an empty queue."""
        state.classes[cls].dispatch_now(tenant, share, cost)
        state.in_flight += 1
        state.by_class[cls].in_flight += 1
        now = self._clock()
        if cls == self._batch_class:
            state.batch_granted_at = now
        state.drain.saturation(now, state.in_flight >= capacity)
        return Slot(state.name, tenant, self.classes[cls], share, cost, 0.0, now)

    async def _queue(
        self,
        state: _Model,
        tenant: str,
        cls: int,
        share: float,
        cost: int,
        deadline: float | None,
    ) -> Slot:
        now = self._clock()
        # Slots may have appeared without a capacity_changed: the queue goes into them first.
        capacity = self._dispatch(state, now)
        if state.queued == 0 and state.in_flight < capacity:
            return self._grant_now(state, tenant, cls, share, cost, capacity)
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded(state.name, self.classes[cls], 0.0)
        if state.queued >= state.max_queued:
            victim = self._victim(state, cls)
            if victim is None:
                raise Overloaded(
                    state.name, self.classes[cls], self._retry_after_s(state, cls, now)
                )
            self._shed(state, victim, now)

        loop = asyncio.get_running_loop()
        waiter = _Waiter(tenant, cls, share, cost, now, deadline, loop.create_future())
        waiter.place = state.classes[cls].push(waiter, tenant, share, cost)
        state.queued += 1
        state.by_class[cls].queued_tokens += cost
        if deadline is not None:
            waiter.timer = self._call_later(deadline - now, partial(self._expire, state, waiter))
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(state, waiter)
            raise

    def _dispatch(self, state: _Model, now: float) -> int:
        """Grant queued requests, highest class first, while slots are free.

        Returns the slot count it went by.
        """
        capacity = state.capacity()
        while state.queued and state.in_flight < capacity:
            queue = next(q for q in state.classes if q)
            place = queue.peek()
            assert place is not None  # a queue that is not empty has a head
            waiter = place.item
            if waiter.future.done():  # cancelled: its task is on its way out
                self._unqueue(state, waiter)
            elif waiter.deadline is not None and waiter.deadline <= now:  # its timer is late
                self._expire(state, waiter)
            else:
                queue.pop()
                state.queued -= 1
                state.in_flight += 1
                counts = state.by_class[waiter.priority]
                counts.queued_tokens -= waiter.cost
                counts.in_flight += 1
                if waiter.timer is not None:
                    waiter.timer.cancel()
                if waiter.priority == self._batch_class:
                    state.batch_granted_at = now
                elif state.batch_granted_at > waiter.arrived:
                    state.delayed_by_batch += 1
                    metrics.labels(metrics.ONLINE_DELAYED_BY_BATCH, state.name).inc()
                slot = Slot(
                    state.name,
                    waiter.tenant,
                    self.classes[waiter.priority],
                    waiter.share,
                    waiter.cost,
                    now - waiter.arrived,
                    now,
                )
                waiter.future.set_result(slot)
        state.drain.saturation(now, state.in_flight >= capacity)
        return capacity

    def _unqueue(self, state: _Model, waiter: _Waiter) -> bool:
        """Take a waiter out of its queue unserved; False if it was no longer queued."""
        assert waiter.place is not None
        if not state.classes[waiter.priority].remove(waiter.place):
            return False
        state.queued -= 1
        state.by_class[waiter.priority].queued_tokens -= waiter.cost
        if waiter.timer is not None:
            waiter.timer.cancel()
        return True

    def _expire(self, state: _Model, waiter: _Waiter) -> None:
        """The deadline timer: a waiter still queued leaves with DeadlineExceeded."""
        if self._unqueue(state, waiter) and not waiter.future.done():
            waited = self._clock() - waiter.arrived
            error = DeadlineExceeded(state.name, self.classes[waiter.priority], waited)
            waiter.future.set_exception(error)

    def _victim(self, state: _Model, cls: int) -> _Waiter | None:
        """The newest request of the lowest class below `cls` that has any queued."""
        for queue in reversed(state.classes[cls + 1 :]):
            place = queue.newest()
            if place is not None:
                return place.item
        return None

    def _shed(self, state: _Model, victim: _Waiter, now: float) -> None:
        retry_after = self._retry_after_s(state, victim.priority, now)
        self._unqueue(state, victim)
        if not victim.future.done():
            victim.future.set_exception(
                Shed(state.name, self.classes[victim.priority], retry_after)
            )

    def _abandon(self, state: _Model, waiter: _Waiter) -> None:
        """The waiting task was cancelled: leave the queue, or give back a granted slot."""
        if self._unqueue(state, waiter):
            return
        future = waiter.future
        if future.cancelled():
            return
        if future.exception() is None:  # granted just before the cancel landed
            self.release(future.result(), 0)
        # Otherwise it was shed or expired meanwhile; the exception is retrieved, unraised.

    def _wait_s(self, state: _Model, cls: int, now: float) -> float:
        capacity = state.capacity()
        ahead = sum(len(q) for q in state.classes[: cls + 1])
        needed = ahead + state.in_flight - capacity + 1
        if needed <= 0:
            return 0.0
        if capacity <= 0:
            return math.inf
        rate = state.drain.rate(now)
        if rate is None:
            return self._default_wait_s
        return needed / rate

    def _retry_after_s(self, state: _Model, cls: int, now: float) -> float:
        wait = self._wait_s(state, cls, now)
        if math.isinf(wait):  # no slots: nobody can say when replicas return
            return self._default_wait_s
        return min(wait, self._max_retry_after_s)
