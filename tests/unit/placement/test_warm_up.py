"""A new replica's warm-up: the smallest request its model serves, sent to that replica
alone, and a replica that fails it is served all the same with a warning."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from gateway.backends.base import ReplicaUnavailable
from gateway.config import ModelConfig
from gateway.inference.types import RequestKind
from gateway.serving.runtime import _route
from gateway.upstream.route import ModelRoute
from gateway_control.placement.warm_up import warm_up
from tests.inprocess.fake_backend import FakeBackend, FakeUpstream

NEW = "http://127.0.0.1:9010"


def route_with(upstream: FakeUpstream, **model: object) -> ModelRoute:
    config = ModelConfig.model_validate({"backend": "triton_http", "replicas": [], **model})
    route = _route("llm", config)
    return replace(route, backend=FakeBackend(upstream, renders_prompt=True))


async def test_a_chat_model_gets_one_token_asked_of_the_new_replica_only() -> None:
    upstream = FakeUpstream()
    assert await warm_up(route_with(upstream), NEW, timeout_s=5)
    [call] = upstream.calls
    assert call.url == NEW and call.call.kind is RequestKind.CHAT
    assert call.call.params.max_tokens == 1


async def test_an_embedding_model_gets_one_short_text() -> None:
    upstream = FakeUpstream()
    embedding = {"capabilities": {"embeddings": {"dimensions": 4}}}
    assert await warm_up(route_with(upstream, **embedding), NEW, timeout_s=5)
    [call] = upstream.calls
    assert call.call.kind is RequestKind.EMBEDDING and len(call.call.inputs) == 1


async def test_a_failed_warm_up_is_a_warning_not_a_stop(caplog: pytest.LogCaptureFixture) -> None:
    upstream = FakeUpstream()
    upstream.script("llm", ReplicaUnavailable("refused"))
    with caplog.at_level(logging.WARNING, "gateway.placement"):
        assert not await warm_up(route_with(upstream), NEW, timeout_s=5)
    assert "warm-up of llm at http://127.0.0.1:9010 failed" in caplog.text
