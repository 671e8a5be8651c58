"""What every backend offers, and the failures it reports."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from gateway.inference.types import (
    Completion,
    Delta,
    UpstreamCall,
    Usage,
    UsageMeter,
    embedding_rows,
)


class UpstreamError(Exception):
    """The upstream failed the request.

    `str()` of it is what a client may be told: a fixed sentence per kind of failure
    (those below), which reads on after "The backend for `model` failed: ". What the
    HTTP or gRPC library, the upstream or the model said (exception text, error bodies,
    tracebacks, internal addresses) is `detail`, for the log only.
    """

    #: Another replica may succeed (connection refused or reset, 503, model not loaded).
    retryable = False

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


class ReplicaUnavailable(UpstreamError):
    """The replica could not take the request; nothing was generated."""

    retryable = True


class UpstreamRejected(UpstreamError):
    """The upstream refused the request itself (bad input); retrying elsewhere will not help."""

    def __init__(self, message: str, status: int = 400, detail: str = "") -> None:
        super().__init__(message, detail)
        self.status = status


class UpstreamTimeout(UpstreamError):
    """No answer in the time allowed."""


# What a client is told of each kind of failure.
CONNECT_FAILED = "the connection to it could not be made."
CONNECTION_LOST = "the connection to it was lost before the answer was complete."
TIMED_OUT = "it did not answer in time."
BAD_ANSWER = "it sent an answer the gateway could not read."
REPORTED_ERROR = "it reported an error instead of the answer."
MODEL_FAILED = "the model failed while generating the answer."
MODEL_REFUSED = "the model could not take the request."


def http_status_failure(status: int) -> str:
    """What a client is told of an upstream that answered with an error status."""
    return f"it answered HTTP {status}."


# What a reason passed on to a client must not look like: a traceback, an exception's
# text or repr (`ValueError: ...`, `KeyError('x')`, `<...>`), a markup page, an address.
_NOT_PLAIN = re.compile(r"Traceback|File \"|\.py\b|\w*(?:Error|Exception)\s*[:(]|<[A-Za-z/!]|://")
_PLAIN_MAX = 300


def plain_reason(text: str) -> str | None:
    """An upstream's or a model's reason for refusing a request, when it is fit for the
    client to read (one short printable line that looks like none of `_NOT_PLAIN`):
    "text_input is required" helps the client fix its request; anything else is only
    logged."""
    text = text.strip()
    if not text or len(text) > _PLAIN_MAX or not text.isprintable() or _NOT_PLAIN.search(text):
        return None
    return text


def model_error(message: str, before_output: bool) -> UpstreamError:
    """A model's own error reported in a Triton response. Before any output, it is the
    model refusing the request (Triton's HTTP frontend answers that with a 400): a client
    error, not the replica's fault, whose reason the client sees if it is a plain one.
    After output started, the generation failed; what the model said (a Python
    traceback, say) is only logged."""
    detail = f"model error: {message}"
    if before_output:
        return UpstreamRejected(plain_reason(message) or MODEL_REFUSED, detail=detail)
    return UpstreamError(MODEL_FAILED, detail)


class Backend(Protocol):
    """Talks to the replicas of models served by one kind of server."""

    #: Whether chat requests go upstream as a prompt rendered by the model's template
    #: (Triton), rather than as the messages themselves (OpenAI-compatible servers).
    renders_prompt: bool

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        """Run the request to completion on the replica at `url`."""
        ...

    def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        """Generate the request's output piece by piece on the replica at `url`."""
        ...

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        """Whether the replica at `url` has the model loaded and ready."""
        ...

    async def close(self) -> None:
        """Release pooled connections."""
        ...


async def collect(deltas: AsyncGenerator[Delta, None], call: UpstreamCall) -> Completion:
    """The whole answer from the pieces of a stream: their text, usage and log
    probabilities together."""
    parts: list[str] = []
    logprobs: list[Any] = []
    meter = UsageMeter()
    async for delta in deltas:
        parts.append(delta.text)
        if delta.logprobs:
            logprobs.extend(delta.logprobs)
        meter.add(delta)
    usage = meter.usage(prompt_estimate=0)
    return Completion(
        text="".join(parts),
        usage=usage,
        finish_reason=call.finish_reason(usage.completion_tokens),
        logprobs=logprobs if call.options.top_logprobs is not None else None,
    )


def token_logprobs(text: str, values: Sequence[float]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` entries for a streamed piece of text and the log
    probabilities of its tokens (TensorRT-LLM's `output_log_probs`), one entry per value.

    A streamed piece is one token, so its entry is exact; a piece of several tokens
    cannot be split without the model's tokenizer: the first entry takes its text.
    """
    entries = []
    for index, value in enumerate(values):
        token = text if index == 0 else ""
        entries.append(
            {
                "token": token,
                "logprob": float(value),
                "bytes": list(token.encode()),
                "top_logprobs": [],
            }
        )
    return entries


def embedding_completion(outputs: Mapping[str, Any], call: UpstreamCall) -> Completion:
    """An embedding call's result from a Triton `infer` answer's outputs by name, each
    raw little-endian bytes or JSON numbers: the vectors of `call.tensors[1]`, one row
    per input, and the input tokens of `num_input_tokens` when the model reports them."""
    output_tensor = call.tensors[1]
    if output_tensor not in outputs:
        raise UpstreamError(BAD_ANSWER, f"no `{output_tensor}` vectors in the answer")
    try:
        vectors = embedding_rows(outputs[output_tensor], len(call.inputs))
    except (TypeError, ValueError) as exc:
        raise UpstreamError(BAD_ANSWER, f"`{output_tensor}`: {exc}") from exc
    counts = outputs.get("num_input_tokens")
    prompt_tokens = 0
    if isinstance(counts, bytes):
        prompt_tokens = int(np.frombuffer(counts, dtype="<i4").sum())
    elif isinstance(counts, list):
        prompt_tokens = int(sum(counts))
    return Completion(text="", usage=Usage(prompt_tokens=prompt_tokens), vectors=vectors)
