"""A scripted upstream for in-process tests: every model's backend is a `FakeBackend`
sharing one `FakeUpstream`, which records each call and answers from a script.

An answer is a `Completion` (whole), a list of `Delta`s (streamed; an exception in the
list is raised at its place, after the pieces before it), an exception (raised before
any output), or a callable `(url, call) -> answer`. Scripts are per upstream model and
per replica URL; what is not scripted gets `default_answer`.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Union

from gateway.backends.base import collect
from gateway.config import BackendKind, ModelConfig
from gateway.inference.types import (
    Completion,
    Delta,
    RequestKind,
    UpstreamCall,
    Usage,
    embedding_rows,
)

Answer = Union[Completion, list[Union[Delta, BaseException]], BaseException]  # noqa: UP007
Script = Union[Answer, Callable[[str, UpstreamCall], Answer]]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class Call:
    """One call a backend received: how (complete or stream), where, and what."""

    mode: str
    url: str
    call: UpstreamCall


def default_answer(url: str, call: UpstreamCall) -> Answer:
    """What an unscripted model answers: vectors for an embedding call, else the same
    text whole or as three pieces, with exact usage."""
    if call.kind is RequestKind.EMBEDDING:
        n = len(call.inputs)
        vectors = embedding_rows([float(i) for i in range(n * 4)], n)
        return Completion(text="", usage=Usage(prompt_tokens=3 * n), vectors=vectors)
    return [
        Delta(text="Hello", output_tokens=1, input_tokens=9),
        Delta(text=" from", output_tokens=1),
        Delta(text=" fake", output_tokens=1),
    ]


class FakeUpstream:
    """The state all fake backends share: scripts and the calls received."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._scripts: dict[tuple[str, str | None], deque[Script]] = defaultdict(deque)
        self._broken: dict[str, Callable[[], BaseException]] = {}

    def script(self, model: str, *answers: Script, url: str | None = None) -> None:
        """The next answers of upstream model `model` (at replica `url` only, if given),
        one per call, in order; then the default."""
        self._scripts[(model, url)].extend(answers)

    def break_replica(self, url: str, error: Callable[[], BaseException]) -> None:
        """Every call to the replica at `url` raises `error()` from now on."""
        self._broken[url] = error

    def calls_to(self, model: str) -> list[Call]:
        return [c for c in self.calls if c.call.upstream_model == model]

    def answer(self, mode: str, url: str, call: UpstreamCall) -> Answer:
        self.calls.append(Call(mode, url, call))
        broken = self._broken.get(url)
        if broken is not None:
            return broken()
        for key in ((call.upstream_model, url), (call.upstream_model, None)):
            queue = self._scripts.get(key)
            if queue:
                script = queue.popleft()
                return script(url, call) if callable(script) else script
        return default_answer(url, call)


class FakeBackend:
    """`gateway.backends.base.Backend` over a `FakeUpstream`."""

    def __init__(self, upstream: FakeUpstream, renders_prompt: bool) -> None:
        self.upstream = upstream
        self.renders_prompt = renders_prompt
        self.closed = False

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        answer = self.upstream.answer("complete", url, call)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Completion):
            return answer
        return await collect(_pieces(answer), call)

    async def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        answer = self.upstream.answer("stream", url, call)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Completion):
            answer = [Delta(text=answer.text, usage=answer.usage)]
        async for delta in _pieces(answer):
            yield delta

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        self.closed = True


async def _pieces(answer: list[Delta | BaseException]) -> AsyncGenerator[Delta, None]:
    for piece in answer:
        if isinstance(piece, BaseException):
            raise piece
        yield replace(piece)  # a fresh copy: the gateway may change what it is given


def backend_factory(upstream: FakeUpstream) -> Callable[[ModelConfig], FakeBackend]:
    """A stand-in for `gateway.serving.runtime._backend`: Triton models render their
    prompt (as the real Triton backends do), OpenAI-compatible ones do not."""

    def make(model: ModelConfig) -> FakeBackend:
        return FakeBackend(upstream, renders_prompt=model.backend is not BackendKind.OPENAI)

    return make
