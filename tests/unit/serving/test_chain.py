"""Which models may serve a request (gateway.serving.chain)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.config import ModelConfig, Tenant
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    Tool,
)
from gateway.serving.auth import Identity
from gateway.serving.chain import (
    ContextTooLong,
    MissingCapability,
    check_context,
    fallback_chain,
)


def route(name: str, **settings: Any) -> Any:
    config = ModelConfig.model_validate(
        {"backend": "openai", "replicas": [{"url": "http://x"}], **settings}
    )
    return SimpleNamespace(name=name, config=config)


ROUTES = {
    "big": route("big", fallback=["tools", "plain", "small"], capabilities={"tools": True}),
    "tools": route("tools", capabilities={"tools": True}, context_length=100),
    "plain": route("plain"),
    "small": route("small", context_length=30),
}
ANYONE = Identity("acme", Tenant.model_validate({"api_keys": ["x"]}))


def request(text: str = "hi", max_tokens: int = 8, **extra: Any) -> InferenceRequest:
    return InferenceRequest(
        RequestKind.CHAT, "big", SamplingParams(max_tokens=max_tokens),
        messages=(ChatMessage("user", text),), **extra,
    )  # fmt: skip


def names(chain: list[Any]) -> list[str]:
    return [r.name for r in chain]


def test_a_plain_request_may_fall_back_to_every_model_it_fits() -> None:
    assert names(fallback_chain(ROUTES, ANYONE, ROUTES["big"], request())) == [
        "big", "tools", "plain", "small",
    ]  # fmt: skip
    # About 100 tokens of prompt: `small` (30) cannot hold it, `tools` (100) neither.
    long = request("word " * 80)
    assert names(fallback_chain(ROUTES, ANYONE, ROUTES["big"], long)) == ["big", "plain"]


def test_a_request_with_tools_falls_back_only_to_models_that_take_them() -> None:
    with_tools = request(options=ChatOptions(tools=(Tool("f"),)))
    assert names(fallback_chain(ROUTES, ANYONE, ROUTES["big"], with_tools)) == ["big", "tools"]
    with pytest.raises(MissingCapability) as missing:
        fallback_chain(ROUTES, ANYONE, ROUTES["plain"], with_tools)
    assert (missing.value.model, missing.value.field) == ("plain", "tools")
    structured = request(options=ChatOptions(response_format=ResponseFormat("json_object")))
    with pytest.raises(MissingCapability) as missing:
        fallback_chain(ROUTES, ANYONE, ROUTES["big"], structured)
    assert missing.value.field == "response_format"


def test_a_tenant_falls_back_only_to_models_it_may_use() -> None:
    limited = Identity(
        "few", Tenant.model_validate({"api_keys": ["x"], "models": ["big", "small"]})
    )
    assert names(fallback_chain(ROUTES, limited, ROUTES["big"], request())) == ["big", "small"]


def test_check_context_counts_the_completion_too() -> None:
    check_context(ROUTES["small"], 20, request(max_tokens=10))
    with pytest.raises(ContextTooLong) as long:
        check_context(ROUTES["small"], 20, request(max_tokens=11))
    assert (long.value.limit, long.value.prompt_tokens, long.value.completion_tokens) == (
        30,
        20,
        11,
    )
    check_context(ROUTES["plain"], 10**6, request())  # no context_length: no check
