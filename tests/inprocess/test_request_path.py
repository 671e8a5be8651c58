"""More of what clients rely on along the request path: request ids, idempotent
repeats, tool calls read from a Triton model's text, the context check, token limits,
and the ops listener kept apart from the API (`Listeners`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from gateway.inference.types import Completion, Usage
from tests.inprocess.conftest import KEYS, InProcessGateway, started_gateway

HELLO = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "llm-large", "messages": HELLO}


async def test_every_answer_and_refusal_has_its_own_request_id(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        answers = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
        refused = await client.post("/v1/chat/completions", json={"model": "nope"})
        message = await client.post(
            "/v1/messages", json={"model": "llm-large", "max_tokens": 8, "messages": HELLO}
        )
        message_refused = await client.post("/v1/messages", json={"model": "nope"})
    ids = [r.headers["x-request-id"] for r in [*answers, refused, message, message_refused]]
    assert len(set(ids)) == len(ids)
    assert [r.json()["id"] for r in answers] == ids[:3]
    assert message.json()["id"] == ids[4]
    assert ids[4].startswith("msg_") and ids[5].startswith("msg_")


async def test_an_idempotent_repeat_gets_the_stored_answer(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-large", Completion("Once.", usage=Usage(3, 1)))
    headers = {"idempotency-key": "order-42"}
    records = gw.finished_records()
    async with gw.http() as client:
        first = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        repeat = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        other = await client.post(
            "/v1/chat/completions",
            json={**CHAT, "messages": [{"role": "user", "content": "Something else"}]},
            headers=headers,
        )
    assert first.status_code == repeat.status_code == 200
    assert repeat.json() == first.json()
    assert repeat.headers["idempotent-replayed"] == "true"
    assert repeat.headers["x-request-id"] == first.headers["x-request-id"]
    assert len(gw.upstream.calls) == 1  # the repeat did not run again
    # The replay's own record names the run whose answer it is (its id is the client's).
    assert [r.replay_of for r in records[:2]] == ["", first.headers["x-request-id"]]
    # The same key with another request is refused, not answered with the first's answer.
    assert other.status_code in (400, 409, 422)
    assert other.json()["error"]["param"] == "Idempotency-Key"


async def test_a_messages_idempotency_refusal_is_an_invalid_request_to_anthropic(
    gw: InProcessGateway,
) -> None:
    """Anthropic's error types: a 4xx without a type of its own (409, 422) is an
    `invalid_request_error`, never `api_error`, which its clients read as the server's;
    and a replay keeps Anthropic's own headers."""
    body = {"model": "llm-large", "max_tokens": 8, "messages": HELLO}
    headers = {"idempotency-key": "order-43", "x-api-key": KEYS["acme"]}
    async with gw.http() as client:
        first = await client.post("/v1/messages", json=body, headers=headers)
        repeat = await client.post("/v1/messages", json=body, headers=headers)
        other = await client.post("/v1/messages", json={**body, "max_tokens": 9}, headers=headers)
    assert first.status_code == repeat.status_code == 200
    # A replay has the headers Anthropic's clients read, as the first answer had.
    assert repeat.headers["request-id"] == first.headers["request-id"]
    assert other.status_code == 422
    assert other.json()["error"]["type"] == "invalid_request_error"


def with_tools(config: dict[str, Any]) -> None:
    """llm-large and its fallback read Hermes-style tool calls from their text."""
    for name in ("llm-large", "llm-small"):
        config["models"][name]["capabilities"] = {"tools": True, "tool_parser": "hermes"}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def test_a_tool_call_in_the_models_text_reaches_the_client_as_one(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with started_gateway(config_for(with_tools), monkeypatch) as gw:
        call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
        gw.upstream.script(
            "llm-large",
            Completion(f"<tool_call>{orjson.dumps(call).decode()}</tool_call>", Usage(20, 12)),
        )
        answer = await gw.openai().chat.completions.create(
            model="llm-large",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER],  # type: ignore[list-item]
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        [tool_call] = choice.message.tool_calls or []
        assert tool_call.function.name == "get_weather"  # type: ignore[union-attr]
        assert orjson.loads(tool_call.function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
        assert not choice.message.content
        # The model saw the tool in its prompt.
        assert "get_weather" in gw.upstream.calls[0].call.prompt


async def test_tools_on_a_model_without_them_are_refused(gw: InProcessGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.openai().chat.completions.create(
            model="llm-large",
            messages=HELLO,
            tools=[WEATHER],  # type: ignore[list-item]
        )
    assert caught.value.code == "unsupported_parameter"
    assert gw.upstream.calls == []


async def test_a_request_longer_than_the_context_is_400_before_any_call(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def short_context(config: dict[str, Any]) -> None:
        config["models"]["llm-small"]["context_length"] = 100

    async with started_gateway(config_for(short_context), monkeypatch) as gw:
        client = gw.openai()
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="llm-small", messages=HELLO, max_tokens=200)
        assert caught.value.code == "context_length_exceeded"
        assert gw.upstream.calls == []
        await client.chat.completions.create(model="llm-small", messages=HELLO, max_tokens=50)
        assert len(gw.upstream.calls) == 1


async def test_a_request_that_can_never_fit_the_token_limit_is_not_to_be_retried(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def small_token_bucket(tenants: dict[str, Any]) -> None:
        tenants["tenants"]["tight"]["limits"] = {"tokens_per_minute": 100, "burst_tokens": 100}

    path = config_for(edit_tenants=small_token_bucket)
    async with started_gateway(path, monkeypatch) as gw, gw.http(KEYS["tight"]) as client:
        # 1,000 tokens reserved for the answer: more than the bucket can ever hold.
        refused = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000})
        fits = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20})
    assert refused.status_code == 429
    assert refused.headers["x-should-retry"] == "false"  # the SDKs give up at once
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert fits.status_code == 200
    assert len(gw.upstream.calls) == 1


OPS_PORT = 9181


async def test_the_ops_listener_is_apart_from_the_api(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_ops_port(config: dict[str, Any]) -> None:
        config["server"] = {"ops": {"port": OPS_PORT}}

    async with started_gateway(config_for(with_ops_port), monkeypatch) as gw:
        async with gw.http() as api:  # port 80 of the test host: the API listener
            answer = await api.post("/v1/chat/completions", json=CHAT)
            api_metrics = await api.get("/metrics")
        ops = gw.http(None)
        ops.base_url = f"http://gateway.test:{OPS_PORT}"  # type: ignore[assignment]
        async with ops:
            ops_metrics = await ops.get("/metrics")
            ops_chat = await ops.post("/v1/chat/completions", json=CHAT)
            ready = await ops.get("/readyz")
    assert answer.status_code == 200
    assert api_metrics.status_code == 403  # on the API port, for admin keys only
    assert ops_metrics.status_code == 200
    assert "gateway_" in ops_metrics.text
    assert ops_chat.status_code == 404  # no API route on the ops port
    assert ready.status_code == 200
