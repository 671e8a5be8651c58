"""A Triton model's tool calls, read from its text (`capabilities.tool_parser`).

The backends hand out text; for a request that offers tools to a model that writes its
calls as text, these turn a whole answer into content and `tool_calls`, and a stream of
text pieces into pieces of content and call fragments as they become certain. A turn
that made calls ends with `finish_reason: "tool_calls"`, unless the token limit cut it:
then `"length"`, and a call cut in the middle is no finished call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

from gateway.inference.tool_parsers import ToolParser, held_prefix
from gateway.inference.types import Completion, Delta, UpstreamCall
from gateway.upstream.route import ModelRoute


def parser_for(route: ModelRoute, call: UpstreamCall) -> ToolParser | None:
    """The parser that reads `route`'s answer to `call` for tool calls, if it is to be."""
    if not call.options.tools or call.options.tool_choice == "none":
        return None  # the usual case: no tools, nothing to read
    return route.tool_parser


def read_completion(parser: ToolParser, completion: Completion) -> Completion:
    """A whole answer with its calls read out of the text."""
    content, calls = parser.parse(completion.text)
    # Cut by the token limit, it says so, calls or not (a cut call was left out).
    cut = completion.finish_reason == "length"
    if cut:
        content = _without_cut_markup(content, parser)
    if not calls:
        return dataclasses.replace(completion, text=content) if cut else completion
    finish = "length" if cut else "tool_calls"
    return dataclasses.replace(completion, text=content, tool_calls=calls, finish_reason=finish)


def _without_cut_markup(text: str, parser: ToolParser) -> str:
    """`text` without the start of a call's markup it ends with (`<too`): cut by the
    token limit there, the model was writing a call, not content."""
    held = held_prefix(text, parser.opening) if parser.opening else 0
    return text[: len(text) - held]


async def read_stream(
    parser: ToolParser, deltas: AsyncIterator[Delta]
) -> AsyncGenerator[Delta, None]:
    """The pieces of a streamed answer with its calls read out as they come. Each piece
    keeps its token count, even when its text is held back for a moment; the finish
    reason comes last, as "tool_calls" if a call was made."""
    stream = parser.stream()
    finish: str | None = None
    called = False
    try:
        async for delta in deltas:
            parsed = stream.feed(delta.text)
            called = called or bool(parsed.calls)
            finish = delta.finish_reason or finish
            tokens = delta.output_tokens
            yield dataclasses.replace(
                delta,
                text=parsed.content,
                output_tokens=(1 if delta.text else 0) if tokens is None else tokens,
                finish_reason=None,
                tool_calls=tuple(parsed.calls),
            )
        parsed = stream.close()
        if finish == "length":
            parsed.content = _without_cut_markup(parsed.content, parser)
        called = called or bool(parsed.calls)
        # Ended inside a call, it was cut: "length", so a client does not take the call's
        # arguments (not valid JSON) for a finished call.
        if stream.truncated:
            finish = "length"
        elif called:
            finish = "tool_calls"
        yield Delta(
            text=parsed.content,
            output_tokens=0,
            finish_reason=finish,
            tool_calls=tuple(parsed.calls),
        )
    finally:
        aclose = getattr(deltas, "aclose", None)
        if aclose is not None:
            await aclose()
