"""The queue of requests waiting for a free replica slot."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(order=True)
class _Entry:
    priority: int
    seq: int
    request_id: str = field(compare=False)
    payload: object = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class RequestQueue:
    """Requests ordered by priority (lower first); equal priorities are served FIFO."""

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._queued: dict[str, _Entry] = {}
        self._seq = itertools.count()

    def push(self, request_id: str, priority: int, payload: object = None) -> None:
        """Queue a request. Raises ValueError if ``request_id`` is already queued."""
        if request_id in self._queued:
            raise ValueError(f"request {request_id!r} is already queued")
        entry = _Entry(priority, next(self._seq), request_id, payload)
        heapq.heappush(self._heap, entry)
        self._queued[request_id] = entry

    def cancel(self, request_id: str) -> bool:
        """Remove a queued request; False if no request with that id is queued."""
        entry = self._queued.pop(request_id, None)
        if entry is None:
            return False
        entry.cancelled = True
        return True

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)

    def pop(self) -> tuple[str, object]:
        """Remove and return ``(request_id, payload)`` of the next request.

        Raises IndexError when the queue is empty.
        """
        self._drop_cancelled()
        if not self._heap:
            raise IndexError("pop from an empty request queue")
        entry = heapq.heappop(self._heap)
        del self._queued[entry.request_id]
        return entry.request_id, entry.payload

    def peek_id(self) -> str | None:
        """The id of the request ``pop`` would return, or None when empty."""
        self._drop_cancelled()
        return self._heap[0].request_id if self._heap else None

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._queued
