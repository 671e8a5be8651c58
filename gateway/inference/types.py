"""The request and result types that flow between the API, the router and the backends."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt


class RequestKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call a model made: the id its result answers, the function's name and
    its arguments as JSON text (as the model wrote them)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call: `parameters` is its arguments' JSON Schema."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None
    strict: bool | None = None


class ToolList(tuple[Tool, ...]):
    """A request's tools as parsed: a tuple with a `__dict__`, on which what is made of
    it is kept (`gateway.inference.memo`), for as long as the list lives."""


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """`response_format` beyond text: any JSON object (`json_object`), or JSON valid for
    `schema` (`json_schema`, with the schema's `name` and `strict`)."""

    type: str
    name: str | None = None
    schema: Mapping[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """What a chat request asks beyond text. `tool_choice` is "none", "auto" or
    "required", or None (the backend's default); `forced_tool` names the one function
    the model must call; `top_logprobs` is None when log probabilities are not asked
    for, else how many alternatives each token gets."""

    tools: tuple[Tool, ...] = ()
    tool_choice: str | None = None
    forced_tool: str | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    top_logprobs: int | None = None


NO_OPTIONS = ChatOptions()


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    # An assistant's calls (its content may then be empty) ...
    tool_calls: tuple[ToolCall, ...] = ()
    # ... and, on a `tool` message, the id of the call it answers.
    tool_call_id: str | None = None


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
    # Tools, structured output, log probabilities: none asked for by default.
    options: ChatOptions = NO_OPTIONS
    # Choices to generate (`n`), for each prompt.
    n: int = 1
    # A text completion of several prompts: all of them (`prompt` is then the first).
    prompts: tuple[str, ...] = ()
    # A text completion that starts with its prompt (`echo`).
    echo: bool = False
    # The texts to embed, and the length of their vectors if shorter than the model's.
    inputs: tuple[str, ...] = ()
    dimensions: int | None = None
    # The vectors as base64 of their float32 bytes (`encoding_format`), not JSON numbers.
    base64: bool = False
    # What the request's API keeps for its answer (`gateway.api.wire`); opaque here.
    wire_state: object = None
    # The client's session, for replica affinity (`gateway.api.sessions`): None, the
    # prompt alone places the request.
    session: str | None = None
    # The types of the request's tools left out, no model here can run them (the
    # Responses API's hosted tools): the answer names them (`x-gateway-omitted-tools`).
    omitted_tools: tuple[str, ...] = ()


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
    # The request's options, as `InferenceRequest` has them.
    options: ChatOptions = NO_OPTIONS
    # An embedding request's texts, and the tensors that carry them in and the vectors out.
    inputs: tuple[str, ...] = ()
    tensors: tuple[str, str] = ("text_input", "embedding")
    # Shorter vectors asked of the upstream (an `openai` one makes them itself).
    dimensions: int | None = None
    # The request's session key (`InferenceRequest.session`).
    session: str | None = None

    def finish_reason(self, completion_tokens: int, tool_calls: bool = False) -> str:
        """OpenAI's finish reason for an output of this many tokens (and tool calls): the
        token limit first, since a call it cut is no finished call."""
        if completion_tokens >= self.params.max_tokens:
            return "length"
        return "tool_calls" if tool_calls else "stop"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece of call `index` carries its id
    and name, later ones more of its arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class Delta:
    """A piece of generated output as it arrives from upstream."""

    text: str
    # Tokens in this piece; None when the upstream does not say.
    output_tokens: int | None = None
    # Prompt tokens, when the upstream reports them (usually once), and of those the
    # ones its prefix cache held.
    input_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    # Exact totals for the whole request, when the upstream reports them at the end.
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # OpenAI's `logprobs.content` entries for this piece's tokens, as the upstream sent.
    logprobs: list[Any] | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens the replica's prefix cache held; None when it does not say.
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @staticmethod
    def sum_of(usages: Iterable[Usage]) -> Usage:
        """The usage of several requests together (the parts of one, `n` choices)."""
        prompt = completion = 0
        cached: int | None = None
        for usage in usages:
            prompt += usage.prompt_tokens
            completion += usage.completion_tokens
            if usage.cached_tokens is not None:
                cached = (cached or 0) + usage.cached_tokens
        return Usage(prompt, completion, cached)


@dataclass(slots=True)
class Completion:
    """A whole non-streamed result."""

    text: str
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: list[Any] | None = None
    # An embedding request's vectors, one row per input (float32).
    vectors: Vectors | None = None


Vectors = npt.NDArray[np.float32]


def embedding_rows(values: Any, inputs: int) -> Vectors:
    """The vectors of `inputs` texts from an FP32 tensor's values (numbers or raw
    little-endian bytes), one row per text; ValueError when they do not divide evenly."""
    if isinstance(values, bytes | bytearray):
        flat = np.frombuffer(values, dtype="<f4")
    else:
        flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if inputs <= 0 or flat.size == 0 or flat.size % inputs:
        raise ValueError(f"{flat.size} numbers for {inputs} texts")
    return flat.reshape(inputs, -1)


class UsageMeter:
    """Adds up the usage of a request from the pieces of its output."""

    __slots__ = ("_exact", "cached_tokens", "completion_tokens", "finish_reason", "prompt_tokens")

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._exact: Usage | None = None

    def add(self, delta: Delta) -> None:
        if delta.usage is not None:
            self._exact = delta.usage
        if delta.input_tokens is not None:
            self.prompt_tokens = delta.input_tokens
        if delta.cached_tokens is not None:
            self.cached_tokens = delta.cached_tokens
        if delta.output_tokens is not None:
            self.completion_tokens += delta.output_tokens
        elif delta.text or delta.tool_calls:
            # Streaming LLM backends send about one token per piece.
            self.completion_tokens += 1
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    def total(self, prompt_estimate: int) -> int:
        """`usage(prompt_estimate).total_tokens`, without making the Usage (per piece)."""
        if self._exact is not None:
            return self._exact.total_tokens
        prompt = self.prompt_tokens if self.prompt_tokens is not None else prompt_estimate
        return prompt + self.completion_tokens

    def usage(self, prompt_estimate: int) -> Usage:
        """The exact usage when the upstream reported it, else the counted one."""
        if self._exact is not None:
            return self._exact
        prompt = self.prompt_tokens if self.prompt_tokens is not None else prompt_estimate
        return Usage(prompt, self.completion_tokens, self.cached_tokens)
