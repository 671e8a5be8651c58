"""Start-time fair queuing (SFQ) of one priority class: tenants share by work, in tokens.

Each class keeps a virtual clock `V`; each tenant a finish tag `F`, the virtual time its
dispatched work reaches. A tenant's next request gets the start tag S = max(V, F) and
would finish at S + cost / share; the queue dispatches the smallest S (ties in arrival
order) and moves V up to it. Only each tenant's oldest queued request (its head) is
tagged and kept in the heap, when it becomes the head: for exact costs that is the tag
SFQ would give it on arrival, and a request that leaves unserved costs its tenant
nothing. docs/admission-algorithm.md has the algorithm, the bound and the reasoning.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# The heap holds one live entry per backlogged tenant; stale ones (a head that left or was
# re-tagged) are skipped when they surface and purged when they outnumber the live ones.
_COMPACT_SLACK = 32


@dataclass(eq=False, slots=True)
class QueuePlace(Generic[T]):
    """One queued request: its tenant, share and cost, and its tag once it is a head."""

    item: T
    tenant: str
    share: float
    cost: float
    seq: int
    queued: bool = True
    start: float = 0.0
    # V when the place was tagged: the floor of its start tag when a correction moves it.
    base: float = 0.0
    entry: tuple[float, int, QueuePlace[T]] | None = field(default=None, repr=False)


@dataclass(eq=False, slots=True)
class _Flow(Generic[T]):
    """A tenant within one class: its finish tag and its queued requests, oldest first."""

    finish: float = 0.0
    queue: OrderedDict[int, QueuePlace[T]] = field(default_factory=OrderedDict)


class FairQueue(Generic[T]):
    """The SFQ queue of one class. Push, pop, remove and correct are O(log tenants)."""

    __slots__ = ("_all", "_flows", "_heap", "_live", "_seq", "virtual_time")

    def __init__(self) -> None:
        self.virtual_time = 0.0
        self._flows: dict[str, _Flow[T]] = {}
        self._heap: list[tuple[float, int, QueuePlace[T]]] = []
        self._live = 0  # live heap entries: one per tenant with something queued
        self._all: OrderedDict[int, QueuePlace[T]] = OrderedDict()  # every queued place, by age
        self._seq = 0

    def __len__(self) -> int:
        return len(self._all)

    def push(self, item: T, tenant: str, share: float, cost: float) -> QueuePlace[T]:
        """Queue `item` behind the tenant's earlier requests."""
        self._seq += 1
        place = QueuePlace(item, tenant, share, cost, self._seq)
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = _Flow()
        flow.queue[place.seq] = place
        self._all[place.seq] = place
        if len(flow.queue) == 1:
            self._tag(place, flow)
        return place

    def peek(self) -> QueuePlace[T] | None:
        """The request to dispatch next: the smallest start tag, the oldest on a tie."""
        heap = self._heap
        while heap:
            entry = heap[0]
            if entry[2].entry is entry:
                return entry[2]
            heapq.heappop(heap)
        return None

    def pop(self) -> QueuePlace[T] | None:
        """Dispatch the request `peek` names: charge its tenant and advance V."""
        place = self.peek()
        if place is None:
            return None
        flow = self._flows[place.tenant]
        flow.finish = place.start + place.cost / place.share
        if place.start > self.virtual_time:
            self.virtual_time = place.start
        self._unlink(place, flow)
        return place

    def remove(self, place: QueuePlace[T]) -> bool:
        """Take a request out unserved (cancelled, expired, shed); its tenant is not charged.

        False if it had already left the queue.
        """
        if not place.queued:
            return False
        self._unlink(place, self._flows[place.tenant])
        return True

    def newest(self) -> QueuePlace[T] | None:
        """The most recently queued request, the first to shed."""
        if not self._all:
            return None
        return next(reversed(self._all.values()))

    def dispatch_now(self, tenant: str, share: float, cost: float) -> None:
        """Account for a request that went upstream without queuing (the fast path).

        Only valid while this class has nothing queued: it takes the place a queued request
        of the tenant would have taken.
        """
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = _Flow()
        start = max(self.virtual_time, flow.finish)
        flow.finish = start + cost / share
        self.virtual_time = start

    def correct(self, tenant: str, share: float, delta_cost: float) -> None:
        """Move the tenant's finish tag by `delta_cost` (actual - estimated tokens) / share.

        Its queued head, if any, is re-tagged, so the correction counts from its very next
        request. A refund never takes the tenant below V: idle share is lent, not banked.
        """
        flow = self._flows.get(tenant)
        if flow is None or delta_cost == 0:
            return
        flow.finish += delta_cost / share
        if flow.queue:
            head = next(iter(flow.queue.values()))
            start = max(head.base, flow.finish)
            if start != head.start:
                self._place(head, start)

    def _tag(self, head: QueuePlace[T], flow: _Flow[T]) -> None:
        head.base = self.virtual_time
        self._place(head, max(self.virtual_time, flow.finish))

    def _place(self, place: QueuePlace[T], start: float) -> None:
        if place.entry is None:
            self._live += 1
        place.start = start
        place.entry = (start, place.seq, place)
        heapq.heappush(self._heap, place.entry)

    def _unlink(self, place: QueuePlace[T], flow: _Flow[T]) -> None:
        place.queued = False
        del self._all[place.seq]
        was_head = place.entry is not None
        del flow.queue[place.seq]
        if was_head:
            place.entry = None
            self._live -= 1
            if flow.queue:
                self._tag(next(iter(flow.queue.values())), flow)
        if len(self._heap) > 2 * self._live + _COMPACT_SLACK:
            self._heap = [e for e in self._heap if e[2].entry is e]
            heapq.heapify(self._heap)
