"""The request and result types that flow between the API, the router and the backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class RequestKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One parsed OpenAI request, independent of the wire format."""

    kind: RequestKind
    model: str
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    messages: tuple[ChatMessage, ...] = ()
    prompt: str = ""
    # The client's own `max_tokens`, or None when the model default applies.
    requested_max_tokens: int | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """What a backend sends to one replica: the request with names and prompt resolved."""

    kind: RequestKind
    upstream_model: str
    # The rendered prompt (Triton backends; empty for chat sent to OpenAI backends) ...
    prompt: str
    # ... or the messages as sent (OpenAI backends apply their own template).
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    # Prompt tokens as estimated before the upstream counts them.
    prompt_estimate: int

    def finish_reason(self, completion_tokens: int) -> str:
        """OpenAI's finish reason for an output of this many tokens."""
        return "length" if completion_tokens >= self.params.max_tokens else "stop"


@dataclass(slots=True)
class Delta:
    """A piece of generated output as it arrives from upstream."""

    text: str
    # Tokens in this piece; None when the upstream does not say.
    output_tokens: int | None = None
    # Prompt tokens, when the upstream reports them (usually once).
    input_tokens: int | None = None
    finish_reason: str | None = None
    # Exact totals for the whole request, when the upstream reports them at the end.
    usage: Usage | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Completion:
    """A whole non-streamed result."""

    text: str
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"


class UsageMeter:
    """Adds up the usage of a request from the pieces of its output."""

    __slots__ = ("_exact", "completion_tokens", "finish_reason", "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._exact: Usage | None = None

    def add(self, delta: Delta) -> None:
        if delta.usage is not None:
            self._exact = delta.usage
        if delta.input_tokens is not None:
            self.prompt_tokens = delta.input_tokens
        if delta.output_tokens is not None:
            self.completion_tokens += delta.output_tokens
        elif delta.text:
            # Streaming LLM backends send about one token per piece.
            self.completion_tokens += 1
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def usage(self, prompt_estimate: int) -> Usage:
        """The exact usage when the upstream reported it, else the counted one."""
        if self._exact is not None:
            return self._exact
        prompt = self.prompt_tokens if self.prompt_tokens is not None else prompt_estimate
        return Usage(prompt_tokens=prompt, completion_tokens=self.completion_tokens)
