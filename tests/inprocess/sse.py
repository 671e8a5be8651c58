"""Reading server-sent events as a client sees them."""

from __future__ import annotations

from typing import Any

import orjson


def events(text: str) -> list[tuple[str | None, str]]:
    """Each event of an SSE body: its `event:` name (None without one) and its data."""
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            found.append((name, "\n".join(data)))
    return found


def data_events(text: str) -> list[str]:
    """The data of each event."""
    return [data for _, data in events(text)]


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Each named event and its JSON data (the Responses and Messages streams)."""
    return [(name or "", orjson.loads(data)) for name, data in events(text)]
