"""Parsed tool lists, kept by their JSON: a coding agent sends the same 20 to 40 tools,
with their schemas, on every turn, and checking them field by field was a third of what
its request cost the gateway before the model was called.

The body decoder leaves a request's top-level `tools` as its JSON text (`ToolsJSON`,
`gateway.api.body.decode_json`): a list seen before is then never turned into Python
objects at all (which cost as much again, allocated and freed), and its text is the key.

A parse is a pure function of the list, so its result is kept by the list's JSON (the
client's text, or `orjson.dumps` of a list already parsed) and shared between tenants: a
hit gives exactly what parsing that list gives. A hit is faster, which tells a tenant
only that a list it already knows byte for byte was sent lately. Lists that fail are not
kept (their 400 is made each time), nor lists larger than `MAX_KEY_BYTES`; the entries
are bounded in number and bytes, the least recently used out first, so a tenant sending
a new list each time pushes out nothing another tenant cannot get back by parsing again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")

# A list kept at most this large, as JSON (Claude Code's 25 tools: about 60 KB).
MAX_KEY_BYTES = 256 * 1024
# Lists kept at most, per cache, in number and in JSON bytes (their Python objects and
# what is made of them, `gateway.inference.memo`, take about 8 times as much): a
# gateway's agents use a few versions of a few tools.
MAX_ENTRIES = 32
MAX_CACHED_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ToolsJSON:
    """A request's `tools` as the client wrote them: JSON text, not parsed yet."""

    text: bytes


def as_json(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A body as JSON values: its `tools`, left as the client's text, as that text (what
    an Idempotency-Key's fingerprint is taken of)."""
    tools = data.get("tools")
    if not isinstance(tools, ToolsJSON):
        return data
    return {**data, "tools": orjson.Fragment(tools.text)}


def key_of(raw: object) -> bytes | None:
    """The JSON of a tool list (as sent, when still text), or None: not JSON's."""
    if isinstance(raw, ToolsJSON):
        return raw.text
    try:
        return orjson.dumps(raw)
    except orjson.JSONEncodeError:  # not JSON's (an integer past 64 bits)
        return None


class ToolListCache(Generic[T]):
    """What `parse` makes of a tool list, by the list's JSON; the parse's result must not
    be changed by its users (it is shared)."""

    def __init__(
        self, parse: Callable[[Any], T], entries: int = MAX_ENTRIES, size: int = MAX_CACHED_BYTES
    ) -> None:
        self._parse = parse
        self._entries: OrderedDict[bytes, T] = OrderedDict()
        self._count = entries
        self._budget = size
        self._bytes = 0

    def parse(self, raw: object) -> T:
        """`parse(raw)`, from the cache when the same list was parsed before."""
        return self._parse(raw) if raw is None else self.lookup(key_of(raw), raw)

    def lookup(self, key: bytes | None, raw: object) -> T:
        """What `parse(raw)` gives, kept under `key` (its JSON; None: not kept)."""
        if key is None:
            return self._parse(raw)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        parsed = self._parse(raw)  # a refusal raises: nothing is kept
        if len(key) <= MAX_KEY_BYTES:
            self._entries[key] = parsed
            self._bytes += len(key)
            while len(self._entries) > self._count or self._bytes > self._budget:
                oldest, _ = self._entries.popitem(last=False)
                self._bytes -= len(oldest)
        return parsed
