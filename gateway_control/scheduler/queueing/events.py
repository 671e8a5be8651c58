"""The replay's event queue: timed events in order, ties broken by kind then by push order.
Pure."""

from __future__ import annotations

import heapq

# Event kinds, in the order they are handled within one instant: releases first.
FINISH, REPAIR, FAIL, ARRIVE, WAKE = range(5)

Event = tuple[float, int, int, int]  # (time, kind, sequence number, subject)


class EventQueue:
    """Events by time; a `WAKE` at most once per instant (it asks for a scheduling pass)."""

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self._wakes: set[float] = set()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, kind: int, subject: int) -> int:
        """Queue an event about `subject` (a job or node index); returns its sequence
        number, which grows with every push (a job's version is its finish event's)."""
        self._seq += 1
        heapq.heappush(self._heap, (time, kind, self._seq, subject))
        return self._seq

    def next_time(self) -> float:
        """When the next event happens (the queue must not be empty)."""
        return self._heap[0][0]

    def pop(self) -> Event:
        """Take the next event."""
        return heapq.heappop(self._heap)

    def wake(self, time: float) -> None:
        """Ask for a scheduling pass at `time` (once per instant)."""
        if time not in self._wakes:
            self._wakes.add(time)
            self.push(time, WAKE, -1)

    def woke(self, time: float) -> None:
        """The wake-up at `time` was handled: a later one at that time is new."""
        self._wakes.discard(time)
