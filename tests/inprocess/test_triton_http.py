"""`TritonHTTPBackend` in process: its aiohttp session replaced by a scripted Triton
(`fake_http`), so what it sends to `/generate`, `/generate_stream` and `/infer` and how
it reads the answers (JSON, SSE, binary tensors, errors) is checked without sockets, on
its own and behind the whole gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gateway.backends.triton_http as triton_http
from gateway.app import build_app
from gateway.backends.base import (
    BAD_ANSWER,
    MODEL_FAILED,
    ReplicaUnavailable,
    UpstreamError,
    UpstreamRejected,
)
from gateway.backends.triton_http import TritonHTTPBackend
from gateway.config.loader import load_config
from gateway.inference.types import (
    ChatMessage,
    RequestKind,
    SamplingParams,
    UpstreamCall,
    Usage,
)
from tests.inprocess.conftest import InProcessGateway, running
from tests.inprocess.fake_backend import FakeUpstream
from tests.inprocess.fake_http import (
    Answer,
    FakeLazySession,
    FakeSession,
    Request,
    generate,
    sse,
)

URL = "http://triton-a"


def chat_call(**params: object) -> UpstreamCall:
    return UpstreamCall(
        kind=RequestKind.CHAT,
        upstream_model="llm-large",
        prompt="<prompt>",
        messages=(ChatMessage("user", "Hi"),),
        params=SamplingParams(**{"max_tokens": 16, **params}),  # type: ignore[arg-type]
        prompt_estimate=3,
    )


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeSession]:
    """`serve(handler)`: every TritonHTTPBackend built from then on talks to a fake Triton
    answering with `handler`."""

    def serve(handler: Callable[[Request], Answer]) -> FakeSession:
        session = FakeSession(handler)
        monkeypatch.setattr(triton_http, "LazySession", lambda *_: FakeLazySession(session))
        return session

    return serve


async def test_generate_request_and_answer(triton: Callable[..., FakeSession]) -> None:
    session = triton(
        lambda _: generate(text_output=["Hi!"], num_input_tokens=5, num_output_tokens=[2])
    )
    backend = TritonHTTPBackend(1.0, 5.0)
    completion = await backend.complete(
        URL, chat_call(temperature=0.5, top_p=0.9, seed=3, stop=("END", "STOP"))
    )
    assert completion.text == "Hi!"
    assert completion.usage == Usage(5, 2, None)
    assert completion.finish_reason == "stop"
    [request] = session.requests
    assert request.url == f"{URL}/v2/models/llm-large/generate"
    assert request.body == {
        "text_input": "<prompt>",
        "max_tokens": 16,
        "stream": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": '["END","STOP"]',  # Triton parameters are scalars: a list as JSON text
    }


async def test_generate_stream_pieces(triton: Callable[..., FakeSession]) -> None:
    session = triton(
        lambda _: sse(
            {"text_output": "Hel", "num_input_tokens": 4, "num_output_tokens": 1},
            {"text_output": "lo", "num_output_tokens": 1, "num_cached_tokens": 2},
        )
    )
    backend = TritonHTTPBackend(1.0, 5.0)
    deltas = [d async for d in backend.stream(URL, chat_call())]
    assert [d.text for d in deltas] == ["Hel", "lo"]
    assert [d.output_tokens for d in deltas] == [1, 1]
    assert deltas[0].input_tokens == 4
    assert deltas[1].cached_tokens == 2
    [request] = session.requests
    assert request.url == f"{URL}/v2/models/llm-large/generate_stream"
    assert request.body["stream"] is True


async def test_a_model_error_before_output_is_a_refusal_after_it_a_failure(
    triton: Callable[..., FakeSession],
) -> None:
    triton(lambda _: sse({"error": "text_input is required"}))
    backend = TritonHTTPBackend(1.0, 5.0)
    with pytest.raises(UpstreamRejected) as refused:
        [d async for d in backend.stream(URL, chat_call())]
    assert str(refused.value) == "text_input is required"  # a plain reason: shown

    triton(lambda _: sse({"text_output": "ok"}, {"error": "Traceback: KeyError('x')"}))
    backend = TritonHTTPBackend(1.0, 5.0)
    seen = []
    with pytest.raises(UpstreamError) as failed:
        async for delta in backend.stream(URL, chat_call()):
            seen.append(delta.text)
    assert seen == ["ok"]
    assert not isinstance(failed.value, UpstreamRejected)
    assert str(failed.value) == MODEL_FAILED  # the traceback is only in `detail`
    assert "KeyError" in failed.value.detail


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (Answer(503, b"busy"), ReplicaUnavailable, "it answered HTTP 503."),
        (Answer(400, b'{"error": "bad sampling"}'), UpstreamRejected, "bad sampling"),
        (Answer(200, b"<html>not json"), UpstreamError, BAD_ANSWER),
    ],
    ids=["503", "400", "not-json"],
)
async def test_error_answers_map_to_backend_errors(
    triton: Callable[..., FakeSession],
    answer: Answer,
    error: type[UpstreamError],
    message: str,
) -> None:
    triton(lambda _: answer)
    with pytest.raises(error) as caught:
        await TritonHTTPBackend(1.0, 5.0).complete(URL, chat_call())
    assert str(caught.value) == message


async def test_infer_binary_embeddings(triton: Callable[..., FakeSession]) -> None:
    vectors = np.array([[1, 2, 3], [4, 5, 6]], dtype="<f4")
    header = orjson.dumps(
        {
            "outputs": [
                {"name": "embedding", "parameters": {"binary_data_size": vectors.nbytes}},
                {"name": "num_input_tokens", "data": [3, 4]},
            ]
        }
    )
    session = triton(
        lambda _: Answer(
            body=header + vectors.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
    )
    call = UpstreamCall(
        kind=RequestKind.EMBEDDING,
        upstream_model="embed",
        prompt="",
        messages=(),
        params=SamplingParams(max_tokens=1),
        prompt_estimate=2,
        inputs=("a", "b"),
    )
    completion = await TritonHTTPBackend(1.0, 5.0).complete(URL, call)
    assert completion.vectors is not None
    assert completion.vectors.tolist() == vectors.tolist()
    assert completion.usage.prompt_tokens == 7
    [request] = session.requests
    assert request.url == f"{URL}/v2/models/embed/infer"
    assert request.body["inputs"][0]["data"] == ["a", "b"]
    assert request.body["parameters"] == {"binary_data_output": True}


@pytest.fixture
async def triton_gateway(
    config_for: Callable[..., Path],
    triton: Callable[..., FakeSession],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[InProcessGateway, FakeSession]]:
    """The gateway with its real backends, Triton HTTP for every model, over a fake Triton
    that streams two pieces, or refuses a prompt that says "please fail"."""

    def answer(request: Request) -> Answer:
        if "please fail" in request.body["text_input"]:
            return sse({"error": "text_input is too long"})
        if request.body["stream"]:
            return sse(
                {"text_output": "Real", "num_input_tokens": 6, "num_output_tokens": 1},
                {"text_output": " backend", "num_output_tokens": 1},
            )
        return generate(text_output="Real backend", num_input_tokens=6, num_output_tokens=2)

    def triton_only(config: dict[str, Any]) -> None:
        del config["models"]["relay"]  # an OpenAI backend: not faked here

    session = triton(answer)
    app = build_app(load_config(str(config_for(triton_only))))
    async with running(app):
        yield InProcessGateway(app, FakeUpstream(), Path()), session


async def test_the_gateway_over_the_real_triton_backend(
    triton_gateway: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, session = triton_gateway
    client = gw.openai()
    answer = await client.chat.completions.create(
        model="llm-large", messages=[{"role": "user", "content": "Hi"}], max_tokens=20
    )
    assert answer.choices[0].message.content == "Real backend"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (6, 2)
    stream = await client.chat.completions.create(
        model="llm-large",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Real backend"
    )
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (6, 2)
    sent = [r.body for r in session.requests]
    assert sent[0]["max_tokens"] == 20
    assert sent[0]["text_input"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert [r.url.rsplit("/", 1)[1] for r in session.requests] == ["generate", "generate_stream"]


async def test_a_models_refusal_reaches_the_client_as_400(
    triton_gateway: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, session = triton_gateway
    async with gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": "llm-large",
                "messages": [{"role": "user", "content": "please fail"}],
                "stream": True,
            },
        )
    assert response.status_code == 400
    assert "text_input is too long" in response.json()["error"]["message"]
    assert len(session.requests) == 1  # a refusal is not retried elsewhere
