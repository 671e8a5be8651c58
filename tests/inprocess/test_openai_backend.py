"""The `relay` model over the real `OpenAIBackend`, its aiohttp session a scripted
OpenAI-compatible server (`fake_http`): the body the gateway sends upstream, and the
upstream's answers, chunks, usage and error events as the client gets them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import openai
import orjson
import pytest

import gateway.backends.openai_compatible as openai_backend
from gateway.app import build_app
from gateway.config.loader import load_config
from tests.inprocess.conftest import InProcessGateway, running
from tests.inprocess.fake_backend import FakeUpstream
from tests.inprocess.fake_http import Answer, FakeLazySession, FakeSession, Request, sse
from tests.inprocess.sse import data_events

HELLO = [{"role": "user", "content": "Hello"}]


def chunk(content: str | None = None, finish: str | None = None) -> dict[str, object]:
    delta = {} if content is None else {"content": content}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def openai_server(request: Request) -> Answer:
    """Answers chat completions; a user message "fail mid-stream" gets an error event."""
    assert request.url == "http://relay-a/v1/chat/completions"
    if request.body.get("stream"):
        if request.body["messages"][-1]["content"] == "fail mid-stream":
            return sse(chunk("Part"), {"error": {"message": "CUDA out of memory at 0x7f"}})
        usage = {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23}
        return sse(
            chunk("Relayed"),
            chunk(" answer"),
            chunk(finish="stop"),
            {"choices": [], "usage": usage},
            done=True,
        )
    return Answer(
        body=orjson.dumps(
            {
                "id": "upstream-id",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Relayed answer"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 21,
                    "completion_tokens": 2,
                    "total_tokens": 23,
                    "prompt_tokens_details": {"cached_tokens": 16},
                },
            }
        )
    )


@pytest.fixture
async def relay(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[InProcessGateway, FakeSession]]:
    """The gateway with its real backends; the OpenAI one talks to `openai_server`."""
    session = FakeSession(openai_server)
    monkeypatch.setattr(openai_backend, "LazySession", lambda *_: FakeLazySession(session))
    # The Triton models are not called here; their backends' readiness checks are.
    monkeypatch.setattr(
        "gateway.backends.triton_http.LazySession", lambda *_: FakeLazySession(session)
    )
    app = build_app(load_config(str(config_for())))
    async with running(app):
        yield InProcessGateway(app, FakeUpstream(), Path()), session


async def test_relayed_answer_and_what_went_upstream(
    relay: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, session = relay
    answer = await gw.openai().chat.completions.create(
        model="relay", messages=HELLO, max_tokens=10, temperature=0.0, stop=["x"]
    )
    assert answer.model == "relay"
    assert answer.id != "upstream-id"  # the gateway's own id
    assert answer.choices[0].message.content == "Relayed answer"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (21, 2)
    details = answer.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 16
    [request] = session.requests
    assert request.body == {
        "model": "relayed-model",
        "max_tokens": 10,
        "messages": HELLO,
        "temperature": 0.0,
        "stop": ["x"],
    }


async def test_relayed_stream_with_the_upstreams_usage(
    relay: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, session = relay
    stream = await gw.openai().chat.completions.create(
        model="relay", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Relayed answer"
    )
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (21, 2)
    # Usage is asked of the upstream whether or not the client asked for it: it is charged.
    assert session.requests[0].body["stream_options"] == {"include_usage": True}


async def test_an_upstream_error_event_ends_the_stream_without_its_text(
    relay: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, _ = relay
    async with gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": "relay",
                "messages": [{"role": "user", "content": "fail mid-stream"}],
                "stream": True,
            },
        )
    payloads = [orjson.loads(p) for p in data_events(response.text)]
    assert payloads[0]["choices"][0]["delta"]["content"] == "Part"
    assert payloads[-1]["error"]["code"] == "upstream_error"
    assert "CUDA" not in response.text and "0x7f" not in response.text


async def test_an_upstream_503_with_no_fallback_is_503(
    relay: tuple[InProcessGateway, FakeSession],
) -> None:
    gw, session = relay
    session.handler = lambda _: Answer(503, b'{"error": {"message": "overloaded"}}')
    with pytest.raises(openai.InternalServerError) as caught:
        await gw.openai().chat.completions.create(model="relay", messages=HELLO)
    assert caught.value.status_code == 503
    assert caught.value.code == "no_replica_available"
