"""What a client is refused with, before any upstream call: the status, the error body
its SDK reads, and the headers it acts on (Retry-After, the rate-limit headers)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.inprocess.conftest import KEYS, InProcessGateway, started_gateway

HELLO = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "llm-large", "messages": HELLO}


def openai_error(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's error object, checked for its shape."""
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("key", [None, "sk-not-a-key"])
async def test_unknown_or_missing_key_is_401(gw: InProcessGateway, key: str | None) -> None:
    async with gw.http(key) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 401
    error = openai_error(response.json())
    assert error["code"] == "invalid_api_key"
    assert response.headers["x-request-id"].startswith("chatcmpl-")
    assert gw.upstream.calls == []


async def test_sdk_raises_authentication_error(gw: InProcessGateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        await gw.openai("sk-wrong").chat.completions.create(model="llm-large", messages=HELLO)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await gw.anthropic("sk-wrong").messages.create(
            model="llm-large", max_tokens=16, messages=HELLO
        )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_unknown_model_is_404_naming_it(gw: InProcessGateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await gw.openai().chat.completions.create(model="no-such-model", messages=HELLO)
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"
    assert "no-such-model" in caught.value.message
    assert gw.upstream.calls == []


async def test_model_the_tenant_may_not_use_is_403(gw: InProcessGateway) -> None:
    client = gw.openai(KEYS["globex"])
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await client.chat.completions.create(model="llm-large", messages=HELLO)
    assert caught.value.code == "model_not_allowed"
    answer = await client.chat.completions.create(model="llm-small", messages=HELLO)
    assert answer.choices[0].message.content == "Hello from fake"
    assert [c.call.upstream_model for c in gw.upstream.calls] == ["llm-small"]


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'{"model": "llm-large"}', b'{"messages": []}'],
    ids=["malformed", "not-an-object", "no-messages", "no-model"],
)
async def test_bad_body_is_400(gw: InProcessGateway, body: bytes) -> None:
    async with gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert openai_error(response.json())["type"] == "invalid_request_error"
    assert gw.upstream.calls == []


async def test_unknown_path_and_wrong_method_have_the_error_shape(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        missing = await client.post("/v1/chat/completion", json=CHAT)
        wrong_method = await client.get("/v1/chat/completions")
    assert missing.status_code == 404
    assert openai_error(missing.json())["code"] == "unknown_url"
    assert wrong_method.status_code == 405
    assert openai_error(wrong_method.json())["code"] == "method_not_allowed"


async def test_body_over_the_limit_is_413(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def small_bodies(config: dict[str, Any]) -> None:
        config["server"] = {"max_body_bytes": 1024}

    async with started_gateway(config_for(small_bodies), monkeypatch) as gw:
        big = [{"role": "user", "content": "x" * 2000}]
        async with gw.http() as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": "llm-large", "messages": big}
            )
        assert response.status_code == 413
        assert openai_error(response.json())["code"] == "request_too_large"
        # The unread rest of the body ends the connection: the client is told to close it.
        assert response.headers["connection"] == "close"
        assert gw.upstream.calls == []


async def test_rate_limit_is_429_with_retry_after(gw: InProcessGateway) -> None:
    async with gw.http(KEYS["tight"]) as client:
        first = await client.post("/v1/chat/completions", json=CHAT)
        second = await client.post("/v1/chat/completions", json=CHAT)
        third = await client.post("/v1/chat/completions", json=CHAT)
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    error = openai_error(third.json())
    assert error["code"] == "rate_limit_exceeded"
    # Whole seconds, at least 1, and no more than one request's worth of refill (30 s).
    assert 1 <= int(third.headers["retry-after"]) <= 30
    assert third.headers["x-request-id"].startswith("chatcmpl-")
    assert len(gw.upstream.calls) == 2  # the refused request never went upstream


async def test_rate_limit_through_the_sdks(gw: InProcessGateway) -> None:
    client = gw.openai(KEYS["tight"])
    for _ in range(2):
        await client.chat.completions.create(model="llm-large", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="llm-large", messages=HELLO)
    assert caught.value.response.headers["retry-after"].isdigit()
    # The same tenant's bucket is spent on the Messages API too, refused in its shape.
    with pytest.raises(anthropic.RateLimitError) as refused:
        await gw.anthropic(KEYS["tight"]).messages.create(
            model="llm-large", max_tokens=16, messages=HELLO
        )
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert refused.value.response.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert refused.value.response.headers["retry-after"].isdigit()


async def test_bad_requests_count_against_the_request_limit(gw: InProcessGateway) -> None:
    async with gw.http(KEYS["tight"]) as client:
        for _ in range(2):
            bad = await client.post("/v1/chat/completions", json={"model": "nope"})
            assert bad.status_code == 404
        refused = await client.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 429
    assert gw.upstream.calls == []


@pytest.mark.parametrize(
    "path", ["/v1/messages/count_tokens", "/v1/responses/resp_nope"], ids=["count", "stored"]
)
async def test_refused_requests_that_ask_for_no_inference_count_too(
    gw: InProcessGateway, path: str
) -> None:
    # count_tokens with a body it refuses, a stored response that is not there: each is
    # counted once, as a refused chat request is, and says which request it was.
    async with gw.http(KEYS["tight"]) as client:
        for _ in range(2):
            if path.endswith("count_tokens"):
                bad = await client.post(path, content=b"{nope")
            else:
                bad = await client.get(path)
            assert bad.status_code in (400, 404)
            assert bad.headers["x-request-id"].startswith("req_")
            assert bad.headers["x-ratelimit-limit-requests"] == "2"
        refused = await client.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 429


async def test_a_count_tokens_answer_is_recorded_once(
    gw: InProcessGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gateway.access")
    async with gw.http() as client:
        answer = await client.post(
            "/v1/messages/count_tokens",
            json={"model": "llm-large", "messages": [{"role": "user", "content": "Hello"}]},
        )
    assert answer.status_code == 200
    [line] = [r.fields for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]
    assert line["request_id"] == answer.headers["x-request-id"]
    assert (line["endpoint"], line["tenant"], line["model"], line["status"]) == (
        "count_tokens", "acme", "llm-large", 200,
    )  # fmt: skip


MISTRAL_CONFIG = (
    Path(__file__).parents[1]
    / "data/tokenizer_configs/mistral-7b-instruct-v0.3/tokenizer_config.json"
)


async def test_a_conversation_the_models_own_template_refuses_is_a_400(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mistral's template refuses roles that do not alternate, as vLLM's server would: the
    # client hears why, in OpenAI's and Anthropic's shape, and nothing goes upstream.
    def mistral(config: dict[str, Any]) -> None:
        config["models"]["llm-small"]["prompt_template"] = str(MISTRAL_CONFIG)

    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    async with started_gateway(config_for(mistral), monkeypatch) as gw:
        async with gw.http() as http:
            reply = await http.post(
                "/v1/chat/completions", json={"model": "llm-small", "messages": twice}
            )
        assert reply.status_code == 400
        error = openai_error(reply.json())
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
        assert error["message"] == (
            "The chat template of `llm-small` refused these messages: After the optional "
            "system message, conversation roles must alternate user/assistant/user/assistant/..."
        )
        with pytest.raises(anthropic.BadRequestError) as refused:
            await gw.anthropic().messages.create(
                model="llm-small",
                max_tokens=16,
                messages=twice,  # type: ignore[arg-type]
            )
        assert "roles must alternate" in refused.value.message
        assert gw.upstream.calls == []
        # An alternating conversation is served, in the model's own format.
        await gw.openai().chat.completions.create(
            model="llm-small", messages=[{"role": "user", "content": "Hi"}]
        )
        [sent] = gw.upstream.calls
        assert sent.call.prompt == "<s>[INST] Hi[/INST]"
