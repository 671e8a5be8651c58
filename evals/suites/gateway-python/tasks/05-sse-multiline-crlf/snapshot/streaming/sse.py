"""Server-sent events (text/event-stream) from upstream model servers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DONE = "[DONE]"


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Parse a stream of lines into events (the subset of the WHATWG rules we need).

    - Each line ends in "\\n", "\\r\\n" or nothing (the last line of a stream).
    - A blank line dispatches the pending event; an event with no ``data`` line is
      dropped. A pending event that no blank line dispatches is dropped too.
    - A line is ``field:value`` or just ``field`` (empty value). If the value starts
      with a space, exactly one space is removed; nothing else is stripped.
    - ``data`` values accumulate and are joined with "\\n"; ``event`` sets the event
      type (default "message"); ``id`` sets the id. Other fields are ignored.
    - Lines starting with ":" are comments.
    """
    data: list[str] = []
    event = "message"
    event_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        if not line:
            if data:
                yield SSEEvent("".join(data), event, event_id)
            data, event, event_id = [], "message", None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.strip()
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            event_id = value


def iter_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each "message" event, up to (not including) the "[DONE]" one."""
    for sse_event in parse_sse(lines):
        if sse_event.event != "message":
            continue
        if sse_event.data == DONE:
            return
        yield sse_event.data
