"""The HTTP APIs the gateway speaks, each a translation onto the one internal request.

A `Wire` says how one API's request bodies parse into an `InferenceRequest`, where its
key is, and how answers, streams and errors are written back. Everything between
(limits, admission, fallback, retries, idempotency, metrics, logs) is the same request
path for every wire (`gateway.api.exchange` over `gateway.serving.conductor`). Each
wire is a package of its own: `api/openai/` (chat, completions, embeddings),
`api/responses/`, `api/anthropic/`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.api.body import Parser
from gateway.api.errors import APIError
from gateway.inference.types import (
    Completion,
    InferenceRequest,
    ToolCallDelta,
    Usage,
)

if TYPE_CHECKING:
    from gateway.serving.auth import Identity
    from gateway.serving.runtime import Runtime


class StreamWriter(Protocol):
    """The events of one streamed answer, in the wire's format."""

    def start(self) -> bytes:
        """Events before the first piece (empty when the wire has none)."""
        ...

    def text(self, text: str, logprobs: list[Any] | None = None, index: int = 0) -> bytes:
        """Generated text (and its tokens' log probabilities)."""
        ...

    def tool_calls(self, fragments: tuple[ToolCallDelta, ...], index: int = 0) -> bytes:
        """Pieces of tool calls."""
        ...

    def close(self, finish_reason: str, usage: Usage) -> bytes:
        """The last events of a stream that ran to its end (OpenAI's finish reason)."""
        ...

    def error(self, error: APIError) -> bytes:
        """The terminal event of a stream that failed after its headers."""
        ...

    def answer(self) -> dict[str, Any] | None:
        """The whole answer as the wire's object, once closed, for a wire that keeps its
        answers (`Wire.keep`); None for the others."""
        ...


class BodyWriter(Protocol):
    def __call__(
        self,
        parts: Sequence[InferenceRequest],
        completions: Sequence[Completion],
        *,
        response_id: str,
        model: str,
    ) -> bytes:
        """The JSON body of a whole answer: `completions[i]` answers `parts[i]`."""
        ...


StreamWriterFactory = Callable[[InferenceRequest, str, str, int], StreamWriter]
# (runtime, caller, body, its size in bytes) -> the parser for it (one that continues a
# stored conversation).
Prepare = Callable[["Runtime", "Identity", Mapping[str, Any], int], Awaitable[Parser]]
# (runtime, caller, request, the answer: the wire's object, or its JSON): keep it; the
# headers a whole answer then gets (why it was not kept, if it was not).
Keep = Callable[
    ["Runtime", "Identity", InferenceRequest, dict[str, Any] | bytes], Awaitable[dict[str, str]]
]


def bearer(headers: Headers) -> str | None:
    """The `Authorization` header, which OpenAI's clients send."""
    return headers.get("authorization")


@dataclass(frozen=True, slots=True)
class Wire:
    """One HTTP API onto the internal request."""

    name: str
    # Of the request id (and the response id, where the wire has one).
    id_prefix: str
    parse: Parser
    body: BodyWriter
    # (request, response id, model, prompt tokens estimated) -> the stream's writer.
    stream_writer: StreamWriterFactory
    # The `Authorization` value the caller is identified by.
    credentials: Callable[[Headers], str | None] = bearer
    # How an error is answered; None: OpenAI's shape (the app's error handlers).
    render_error: Callable[[APIError], Response] | None = None
    # Headers the wire adds to an answer's, from them (its own rate-limit headers).
    more_headers: Callable[[dict[str, str]], dict[str, str]] | None = None
    # The event a stream sends while it waits long for the next (`server.
    # stream_ping_interval_s`); None: the wire has none.
    ping: bytes | None = None
    # Before parsing: what the request needs from storage (a previous conversation).
    prepare: Prepare | None = None
    # After a whole answer: keep it (stored responses).
    keep: Keep | None = None
    # Its operation in the GenAI semantic conventions (`gen_ai.operation.name`, the first
    # word of a trace's server span): the Responses and Messages APIs are chats.
    operation: str = "chat"
