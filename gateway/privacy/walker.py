"""Every string of a structure, found and replaced without a list of fields.

A request is dataclasses holding strings, tuples, and JSON (tool schemas, metadata):
`Walker.strings` yields every string in it, dictionary keys included, and
`Walker.rewrite` builds a copy with strings replaced. Neither names a field, so a field
added to the request later is covered the day it is added; what is left out is said
once, by type and field name (`skip`). Enums (`RequestKind` is a `str`) and other
values (numbers, booleans) are not text a client wrote and are left as they are.

Both visit an object the structure holds twice only once (the Responses API keeps the
conversation it sends in its answer's state too), and `rewrite` returns the object
itself wherever nothing in it changed. `rewrite` recurses: the gateway refuses request
bodies nested past 128 levels, well inside Python's limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from typing import Any

# Fields not to walk, by dataclass type.
Skip = Mapping[type, frozenset[str]]
# A string and the dictionary key it is the value of (of a list under that key too).
Replace = Callable[[str, str | None], str]


# Values that hold no text, skipped without a look.
_SCALARS = frozenset({int, float, bool, type(None)})


def _is_text(value: object) -> bool:
    """A string a client wrote: not an enum member (`RequestKind` is a `str` too)."""
    return type(value) is str or (isinstance(value, str) and not isinstance(value, Enum))


class Walker:
    """Finds and replaces the strings of structures, leaving out the fields of `skip`."""

    def __init__(self, skip: Skip) -> None:
        self._skip = skip
        self._fields: dict[type, tuple[str, ...]] = {}

    def strings(self, value: object) -> Iterator[tuple[str, str | None]]:
        """Every string in `value` (each object once), with the key it is the value of."""
        seen_strings: set[tuple[int, str | None]] = set()
        seen: set[int] = set()
        # Depth first, by hand: JSON from a client nests as deep as the parser allowed.
        # Strings are yielded as their container is opened, never stacked: a tool
        # schema is mostly strings, and this loop runs for each of them.
        stack: list[tuple[object, str | None]] = [(value, None)]
        while stack:
            item, key = stack.pop()
            if _is_text(item):
                marker = (id(item), key)
                if marker not in seen_strings:
                    seen_strings.add(marker)
                    yield item, key  # type: ignore[misc]
                continue
            if id(item) in seen:
                continue
            seen.add(id(item))
            for child, child_key in self._children(item, key):
                if type(child) is str:
                    marker = (id(child), child_key)
                    if marker not in seen_strings:
                        seen_strings.add(marker)
                        yield child, child_key
                elif type(child) not in _SCALARS:
                    stack.append((child, child_key))

    def _children(self, item: object, key: str | None) -> Iterator[tuple[object, str | None]]:
        """What `item` holds, each with the key it is the value of; keys of mappings too."""
        kind = type(item)
        if kind is list or kind is tuple:
            for child in item:  # type: ignore[attr-defined]
                yield child, key
        elif kind is dict or isinstance(item, Mapping):
            for name, child in item.items():  # type: ignore[attr-defined]
                if _is_text(name):
                    yield name, None
                    yield child, name
                else:
                    yield child, None
        elif isinstance(item, list | tuple):
            for child in item:
                yield child, key
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for name in self._names(kind):
                yield getattr(item, name), None

    def rewrite(self, value: Any, replace: Replace) -> Any:
        """`value` with every string `s` (the value of key `k`) replaced by
        `replace(s, k)`: new containers where something inside changed, the same
        objects elsewhere."""
        return self._rewrite(value, None, replace, {})

    def _rewrite(
        self, item: Any, key: str | None, replace: Replace, done: dict[tuple[int, str | None], Any]
    ) -> Any:
        marker = (id(item), key)
        if marker in done:
            return done[marker]
        new: Any = item
        if isinstance(item, str):
            if not isinstance(item, Enum):
                new = replace(item, key)
        elif isinstance(item, Mapping):
            changed = False
            pairs = []
            for name, child in item.items():
                text_key = name if isinstance(name, str) else None
                new_name = name if text_key is None else self._rewrite(name, None, replace, done)
                new_child = self._rewrite(child, text_key, replace, done)
                changed = changed or new_name is not name or new_child is not child
                pairs.append((new_name, new_child))
            if changed:
                new = dict(pairs)
        elif isinstance(item, list | tuple):
            children = [self._rewrite(child, key, replace, done) for child in item]
            if any(new_child is not child for new_child, child in zip(children, item, strict=True)):
                new = list(children) if isinstance(item, list) else tuple(children)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            changes = {}
            for name in self._names(type(item)):
                child = getattr(item, name)
                replaced = self._rewrite(child, None, replace, done)
                if replaced is not child:
                    changes[name] = replaced
            if changes:
                new = dataclasses.replace(item, **changes)
        done[marker] = new
        return new

    def _names(self, kind: type) -> tuple[str, ...]:
        names = self._fields.get(kind)
        if names is None:
            left_out = self._skip.get(kind, frozenset())
            fields = dataclasses.fields(kind)
            names = self._fields[kind] = tuple(f.name for f in fields if f.name not in left_out)
        return names
