"""A request longer than the model's context is refused up front, before it is charged
or queued; a fallback the request cannot fit is left out of the chain."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from aiohttp import web
from openai import OpenAI

from tests.e2e.stack import Gateway, default_tenants, model, running_gateway
from tests.e2e.upstreams import chat_upstream, serve_in_thread

CALLS: list[int] = []


async def answer(request: web.Request) -> web.Response:
    CALLS.append(1)
    message = {"role": "assistant", "content": "ok"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return web.json_response(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
    )


async def fail(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "boom"}}, status=500)


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve_in_thread([chat_upstream(answer), chat_upstream(fail)]) as urls:
        models = {
            "small-context": model(
                "openai", urls[:1], context_length=1000, max_tokens_default=100
            ),
            # Healthy to the health checks, failing every request.
            "down": model(
                "openai", urls[1:], fallback=["small-context"], fallback_on=["replica_error"],
                max_tokens_default=100, max_attempts=1,
            ),
        }  # fmt: skip
        with running_gateway(
            tmp_path_factory.mktemp("context"),
            models,
            redis_url,
            tenants=default_tenants(["small-context"]),
        ) as gw:
            yield gw


def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_sent(gateway: Gateway) -> None:
    calls = len(CALLS)
    long_prompt = "word " * 4000  # about 5,000 tokens by the gateway's estimate
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).chat.completions.create(
            model="small-context", messages=[{"role": "user", "content": long_prompt}]
        )
    assert refused.value.code == "context_length_exceeded"
    assert "maximum context length is 1000 tokens" in refused.value.message
    assert len(CALLS) == calls  # nothing was sent upstream
    # Nor charged: the access record shows no tokens, and no rate-limit decision was made.
    request_id = refused.value.response.headers["x-request-id"]
    record = gateway.access_record(request_id)
    assert (record["status"], record["prompt_tokens"]) == (400, 0)
    # max_tokens counts too: a short prompt with a completion the context cannot hold.
    with pytest.raises(openai.BadRequestError):
        client(gateway).chat.completions.create(
            model="small-context", messages=[{"role": "user", "content": "hi"}], max_tokens=999
        )
    reply = client(gateway).chat.completions.create(
        model="small-context", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "ok"


def test_a_fallback_the_request_cannot_fit_is_left_out(gateway: Gateway) -> None:
    short = client(gateway).chat.completions.with_raw_response.create(
        model="down", messages=[{"role": "user", "content": "hi"}]
    )
    assert short.headers["x-gateway-fallback"] == "down->small-context; reason=replica_error"
    with pytest.raises(openai.APIStatusError) as failed:
        client(gateway).chat.completions.create(
            model="down", messages=[{"role": "user", "content": "word " * 4000}]
        )
    # `down` takes any length; its replica fails, and the fallback cannot fit the request.
    assert failed.value.status_code in (502, 503)
    assert "x-gateway-fallback" not in failed.value.response.headers
