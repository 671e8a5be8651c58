"""Tool calls out of generated text, as vLLM's tool parsers read them.

A Triton LLM answers in text; a model trained for function calling writes its calls in
a format of its family, which the model's `capabilities.tool_parser` names:

- `hermes` (Hermes, Qwen 2.5 and later): each call is a JSON object
  `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`; text
  outside the blocks is the message's content.
- `llama3_json` (Llama 3.1 and later): the whole answer is one JSON object
  `{"name": ..., "parameters": {...}}` (or several separated by `;`), possibly after
  `<|python_tag|>`; an answer that does not start with `{` is plain content.

`parse` reads a whole answer. `stream()` gives a parser that reads one as it arrives and
hands out content and call fragments as soon as they are certain: text before a call
at once, a call's id and name as soon as its name is written, then its arguments as
they come (all but a closing brace that may still turn out to end the call object).

A call the parser cannot read (not JSON, no name) is never dropped: it stays content,
as the model wrote it. Streamed, a call whose name was already sent keeps the arguments
as written.
"""

from __future__ import annotations

import dataclasses
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from gateway.inference.ids import random_id
from gateway.inference.types import ToolCall, ToolCallDelta

_DECODER = json.JSONDecoder()


def new_call_id() -> str:
    """A call id in OpenAI's shape (`call_` and 24 characters)."""
    return "call_" + random_id()


def _call(value: object) -> ToolCall | None:
    """The call a decoded JSON value describes, or None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    # Some models write the arguments as JSON text already.
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(new_call_id(), value["name"], text)


def _decode_call(text: str) -> ToolCall | None:
    try:
        call = _call(json.loads(text))
    except (ValueError, RecursionError):
        return None
    if call is None:
        return None
    # The arguments as the model wrote them (what a stream sends), not as re-encoded.
    head = _CallWriter.HEAD.match(text)
    if head is not None:
        try:
            _, end = _DECODER.raw_decode(text, head.end())
        except (ValueError, RecursionError):
            return call
        written = text[head.end() : end]
        if written.startswith("{"):
            return dataclasses.replace(call, arguments=written)
    return call


@dataclass
class Parsed:
    """What a piece of generated text holds: content, and call fragments."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, other: Parsed) -> None:
        self.content += other.content
        self.calls += other.calls


class StreamingParser(ABC):
    """Reads one answer as it arrives (see the module docstring). `truncated`, once it is
    closed: the answer ended inside a call (cut by the token limit), which is then no
    finished call."""

    truncated = False

    @abstractmethod
    def feed(self, text: str) -> Parsed:
        """What `text`, the next piece, makes certain."""

    @abstractmethod
    def close(self) -> Parsed:
        """What was held back, at the end of the answer."""


class ToolParser(ABC):
    # What a call's markup starts with: an answer cut by the token limit that ends with
    # the start of it (`<too`) ends inside markup, which is no content.
    opening = ""

    @abstractmethod
    def parse(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        """A whole answer's content and calls."""

    @abstractmethod
    def stream(self) -> StreamingParser:
        """A parser for one streamed answer."""


class _CallWriter:
    """Streams one call: its header once the name is known, then its arguments' text as
    it comes, up to the brace that closes the arguments object (found by following the
    JSON's nesting and strings; what follows is the call object's end, not arguments)."""

    # `{"name": "x", "arguments": ` (or `"parameters"`), as far as it goes.
    HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = new_call_id()
        self.name: str | None = None
        self._arguments_at = 0
        self._sent = 0
        self._scan = _ObjectScan()

    def progress(self, body: str) -> list[ToolCallDelta]:
        """Fragments for the call's text so far (`body`, from its opening brace on)."""
        out = []
        if self.name is None:
            head = self.HEAD.match(body)
            if head is None:
                return []
            self.name, self._arguments_at = head.group(1), head.end()
            out.append(ToolCallDelta(self.index, self.id, self.name, ""))
        self._skip_blanks(body)
        certain = self._arguments_at + self._scan.feed(body[self._arguments_at :])
        if certain > self._arguments_at + self._sent:
            piece = body[self._arguments_at + self._sent : certain]
            self._sent += len(piece)
            out.append(ToolCallDelta(self.index, arguments=piece))
        return out

    def _skip_blanks(self, body: str) -> None:
        # The blanks before the arguments' `{` (the head may have matched before they
        # came) are not the arguments: they would begin with a space.
        if not self._sent and self._scan.untouched:
            while self._arguments_at < len(body) and body[self._arguments_at].isspace():
                self._arguments_at += 1

    def finish(self, body: str) -> Parsed | None:
        """The call's last fragments once its text is whole; None when it cannot be read
        and nothing of it was sent (it is then content)."""
        call = _decode_call(body)
        if self.name is None:
            if call is None:
                return None
            return Parsed(calls=[ToolCallDelta(self.index, self.id, call.name, call.arguments)])
        self._skip_blanks(body)
        end = len(body.rstrip())
        try:
            # The arguments value as written: where it ends, so the outer `}` is left out.
            _, end = _DECODER.raw_decode(body, self._arguments_at)
        except ValueError:
            end = body.rstrip().rfind("}") if body.rstrip().endswith("}") else end
        rest = body[self._arguments_at + self._sent : end]
        self._sent += len(rest)
        return Parsed(calls=[ToolCallDelta(self.index, arguments=rest)] if rest else [])


class _ObjectScan:
    """How much of a JSON object's text, given as it grows, is surely the object's: all
    of it until its closing brace, which ends it. Text that does not start an object is
    never sure (the call's whole text decides it)."""

    __slots__ = ("_depth", "_end", "_escaped", "_in_string", "_seen")

    @property
    def untouched(self) -> bool:
        """Nothing fed yet."""
        return self._seen == 0 and self._end is None

    def __init__(self) -> None:
        self._seen = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._end: int | None = None

    def feed(self, text: str) -> int:
        """The length of `text` (the object's text so far) that is surely the object's."""
        if self._end is not None:
            return self._end
        for position in range(self._seen, len(text)):
            char = text[position]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._end = position + 1
                    return self._end
            elif self._depth == 0 and not char.isspace():
                self._end = 0  # not an object: nothing is sure
                return 0
        self._seen = len(text)
        # Leading blanks are sure only once the object has started.
        return len(text) if self._depth > 0 else 0


# --- hermes ------------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)


class HermesParser(ToolParser):
    opening = _OPEN

    def parse(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        calls: list[ToolCall] = []
        content: list[str] = []
        position = 0
        for block in _BLOCK.finditer(text):
            call = _decode_call(block.group(1).strip())
            if call is None and block.end() == len(text) and not block.group(0).endswith(_CLOSE):
                # Cut off inside the call (the token limit): no call, and no markup either.
                content.append(text[position : block.start()])
                position = block.end()
                continue
            if call is None:
                continue  # not readable: stays in the content as written
            content.append(text[position : block.start()])
            calls.append(call)
            position = block.end()
        content.append(text[position:])
        joined = "".join(content)
        return (joined.strip() if calls else joined), tuple(calls)

    def stream(self) -> StreamingParser:
        return _HermesStream()


def held_prefix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that `marker` starts with."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class _HermesStream(StreamingParser):
    def __init__(self) -> None:
        self._buffer = ""
        self._call: _CallWriter | None = None
        self._calls = 0

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        out = Parsed()
        while True:
            if self._call is None:
                start = self._buffer.find(_OPEN)
                if start < 0:
                    keep = held_prefix(self._buffer, _OPEN)
                    out.content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return out
                out.content += self._buffer[:start]
                self._buffer = self._buffer[start + len(_OPEN) :]
                self._call = _CallWriter(self._calls)
                continue
            end = self._buffer.find(_CLOSE)
            if end < 0:
                out.calls += self._call.progress(self._buffer)
                return out
            out.add(self._end_call(self._buffer[:end]))
            self._buffer = self._buffer[end + len(_CLOSE) :]

    def _end_call(self, body: str) -> Parsed:
        assert self._call is not None
        finished = self._call.finish(body)
        self._call = None
        if finished is None:
            return Parsed(content=_OPEN + body + _CLOSE)
        self._calls += 1
        return finished

    def close(self) -> Parsed:
        if self._call is None:
            out = Parsed(content=self._buffer)
        else:  # cut off inside a call (max_tokens): what was sent of it, and no markup
            self.truncated = True
            out = self._end_call(self._buffer)
            out.content = ""
        self._buffer = ""
        return out


# --- llama3_json -------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"


def _llama3_calls(text: str) -> tuple[ToolCall, ...] | None:
    """The calls of an answer made of JSON objects separated by `;`, or None."""
    body = _llama3_body(text).strip()
    calls = []
    position = 0
    while position < len(body):
        try:
            value, position = _DECODER.raw_decode(body, position)
        except ValueError:
            return None
        call = _call(value)
        if call is None:
            return None
        calls.append(call)
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        position = len(body) - len(rest)
    return tuple(calls) or None


class Llama3JsonParser(ToolParser):
    opening = _PYTHON_TAG

    def parse(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        calls = _llama3_calls(text)
        return ("", calls) if calls else (text, ())

    def stream(self) -> StreamingParser:
        return _Llama3Stream()


def _llama3_body(text: str) -> str:
    """The answer from its first call object on (`<|python_tag|>` left out)."""
    return text.lstrip().removeprefix(_PYTHON_TAG)


class _Llama3Stream(StreamingParser):
    """Text until it is clear whether the answer is a call (its first characters); a call
    is streamed as it comes; further calls after `;` come whole at the end."""

    def __init__(self) -> None:
        self._buffer = ""
        self._mode: str | None = None  # "text" or "call", once known
        self._call = _CallWriter(0)

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        if self._mode is None:
            start = self._buffer.lstrip()
            if not start or _PYTHON_TAG.startswith(start):
                return Parsed()
            begins_call = start.startswith("{") or start.startswith(_PYTHON_TAG)
            self._mode = "call" if begins_call else "text"
        if self._mode == "text":
            out, self._buffer = Parsed(content=self._buffer), ""
            return out
        body = _llama3_body(self._buffer)
        first_end = body.find(";")  # later calls: whole, at the end
        return Parsed(calls=self._call.progress(body if first_end < 0 else body[:first_end]))

    def close(self) -> Parsed:
        buffer, self._buffer = self._buffer, ""
        if self._mode != "call":
            return Parsed(content=buffer)
        body = _llama3_body(buffer)
        calls = _llama3_calls(buffer)
        if calls is None:
            if self._call.name is None:
                return Parsed(content=buffer)  # not a call after all
            self.truncated = True  # a call that does not end: cut off
            return self._call.finish(body) or Parsed()
        start = len(body) - len(body.lstrip())
        _, first_end = _DECODER.raw_decode(body, start)
        out = self._call.finish(body[:first_end]) or Parsed()
        for index, call in enumerate(calls[1:], start=1):
            out.calls.append(ToolCallDelta(index, call.id, call.name, call.arguments))
        return out


TOOL_PARSERS: dict[str, ToolParser] = {
    "hermes": HermesParser(),
    "llama3_json": Llama3JsonParser(),
}
