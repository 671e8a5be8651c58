"""An upstream that fails, as the fake backend raises the backends' own errors: which
status the client gets, when another replica or the fallback model is tried, and what
of the upstream's failure the client is (not) told."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from gateway.backends.base import (
    CONNECT_FAILED,
    MODEL_FAILED,
    TIMED_OUT,
    ReplicaUnavailable,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.inference.types import Delta
from tests.inprocess.conftest import InProcessGateway, started_gateway
from tests.inprocess.sse import data_events, named_events

HELLO = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "llm-large", "messages": HELLO}
# What an upstream's failure says for the log only: never shown to the client.
SECRET = "Traceback (most recent call last): File /srv/model.py, token=abc123"
LARGE = ("http://large-a", "http://large-b")


def unavailable() -> ReplicaUnavailable:
    return ReplicaUnavailable(CONNECT_FAILED, detail=SECRET)


async def test_a_replica_that_cannot_take_the_request_is_retried_on_the_other(
    gw: InProcessGateway,
) -> None:
    gw.upstream.script("llm-large", unavailable())  # the first call, whichever replica
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="llm-large", messages=HELLO
    )
    answer = raw.parse()
    assert answer.model == "llm-large"
    assert answer.choices[0].message.content == "Hello from fake"
    urls = [c.url for c in gw.upstream.calls]
    assert len(urls) == 2 and set(urls) == set(LARGE)  # the other replica, not the same
    assert "x-gateway-fallback" not in raw.headers


async def test_all_replicas_failing_falls_back_to_the_next_model(gw: InProcessGateway) -> None:
    for url in LARGE:
        gw.upstream.break_replica(url, unavailable)
    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="llm-large", messages=HELLO
    )
    answer = raw.parse()
    assert answer.model == "llm-small"
    assert raw.headers["x-gateway-fallback"] == "llm-large->llm-small; reason=replica_error"
    models = [c.call.upstream_model for c in gw.upstream.calls]
    assert models[-1] == "llm-small"
    assert set(models[:-1]) == {"llm-large"}
    # The fallback model gets the request rendered by its own template.
    assert "<|im_start|>user\nHello<|im_end|>" in gw.upstream.calls[-1].call.prompt


async def test_a_stream_falls_back_before_its_first_token(gw: InProcessGateway) -> None:
    for url in LARGE:
        gw.upstream.break_replica(url, unavailable)
    async with gw.http() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["x-gateway-fallback"] == "llm-large->llm-small; reason=replica_error"
    payloads = data_events(response.text)
    assert payloads[-1] == "[DONE]"
    assert {orjson.loads(p)["model"] for p in payloads[:-1]} == {"llm-small"}


async def test_no_replica_and_no_fallback_is_503_with_retry_after(gw: InProcessGateway) -> None:
    gw.upstream.break_replica("http://small-a", unavailable)
    async with gw.http() as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "llm-small", "messages": HELLO}
        )
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "no_replica_available"
    assert int(response.headers["retry-after"]) >= 1
    assert SECRET not in response.text
    assert response.headers["x-request-id"].startswith("chatcmpl-")


async def test_a_refused_request_is_400_and_not_retried(gw: InProcessGateway) -> None:
    gw.upstream.script(
        "llm-large", UpstreamRejected("text_input is required", status=400, detail=SECRET)
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.openai().chat.completions.create(model="llm-large", messages=HELLO)
    assert "refused the request: text_input is required" in caught.value.message
    assert SECRET not in caught.value.response.text
    assert len(gw.upstream.calls) == 1  # neither another replica nor the fallback


async def test_a_model_failure_is_502_without_the_upstreams_detail(gw: InProcessGateway) -> None:
    # The last model of its chain: nothing to fall back to.
    gw.upstream.script("llm-small", UpstreamError(MODEL_FAILED, detail=SECRET))
    async with gw.http() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "model": "llm-small"})
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_error"
    assert error["message"] == f"The backend for `llm-small` failed: {MODEL_FAILED}"
    assert SECRET not in response.text
    assert len(gw.upstream.calls) == 1  # not retryable: output may have been generated


async def test_an_upstream_timeout_is_504(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-small", UpstreamTimeout(TIMED_OUT, detail=SECRET))
    with pytest.raises(openai.APIStatusError) as caught:
        await gw.openai().chat.completions.create(model="llm-small", messages=HELLO)
    assert caught.value.status_code == 504
    assert caught.value.code == "timeout"


async def test_a_failure_mid_stream_ends_it_with_an_error_event(gw: InProcessGateway) -> None:
    gw.upstream.script(
        "llm-large", [Delta(text="Half an ans"), UpstreamError(MODEL_FAILED, detail=SECRET)]
    )
    async with gw.http() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200  # the headers had gone out
    payloads = [orjson.loads(p) for p in data_events(response.text)]  # no [DONE]
    assert payloads[0]["choices"][0]["delta"]["content"] == "Half an ans"
    assert payloads[-1]["error"]["code"] == "upstream_error"
    assert MODEL_FAILED in payloads[-1]["error"]["message"]
    assert SECRET not in response.text
    assert len(gw.upstream.calls) == 1  # output had started: no retry, no fallback


async def test_the_openai_sdk_raises_on_a_stream_error_event(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-large", [Delta(text="Hi"), UpstreamError(MODEL_FAILED)])
    stream = await gw.openai().chat.completions.create(
        model="llm-large", messages=HELLO, stream=True
    )
    seen = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            seen.append(chunk.choices[0].delta.content)
    assert seen == ["Hi"]


async def test_a_messages_stream_failure_is_an_anthropic_error_event(
    gw: InProcessGateway,
) -> None:
    gw.upstream.script("llm-large", [Delta(text="Hi"), UpstreamError(MODEL_FAILED, SECRET)])
    async with gw.http() as client:
        response = await client.post(
            "/v1/messages",
            json={"model": "llm-large", "max_tokens": 16, "messages": HELLO, "stream": True},
        )
    events = named_events(response.text)
    name, data = events[-1]
    assert name == "error"
    assert data["type"] == "error"
    assert data["error"]["type"] == "api_error"
    assert SECRET not in response.text
    assert "message_stop" not in [n for n, _ in events]


@pytest.mark.parametrize(
    "error", [UpstreamError(MODEL_FAILED), UpstreamTimeout(TIMED_OUT)], ids=["failed", "timeout"]
)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_failure_before_output_falls_back_streamed_or_not(
    gw: InProcessGateway, error: UpstreamError, stream: bool
) -> None:
    # `replica_error`: every replica tried failed before any output. A whole answer has
    # no output until it is whole, so it falls back as a stream does before its first
    # piece (it used to get the 502 or 504 instead).
    gw.upstream.script("llm-large", error, error)
    async with gw.http() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert response.status_code == 200
    assert response.headers["x-gateway-fallback"] == "llm-large->llm-small; reason=replica_error"


def stream_hello_then_nothing(gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """llm-large streams its first piece, then nothing more for 30 s."""
    route = gw.app.app.state.runtime.routes["llm-large"]  # type: ignore[attr-defined]

    async def first_then_nothing(url: str, call: Any) -> AsyncGenerator[Delta, None]:
        yield Delta(text="Hello", output_tokens=1)
        await asyncio.sleep(30)  # cut at the deadline
        yield Delta(text="never")

    monkeypatch.setattr(route.backend, "stream", first_then_nothing)


async def test_a_stream_cut_at_its_deadline_says_so(
    gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream that started, then ran past the client's `x-request-timeout`, ends with
    a terminal `deadline_exceeded` event, recorded with reason `deadline`: the request's
    own time, not a slow backend (the new-user review of issue 40 saw `timeout`, "the
    backend did not answer in time", for its own deadline)."""
    stream_hello_then_nothing(gw, monkeypatch)
    caplog.set_level(logging.INFO, "gateway.access")
    async with gw.http(**{"x-request-timeout": "0.3"}) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    last = [line for line in response.text.splitlines() if line.startswith("data: ")][-1]
    error = json.loads(last.removeprefix("data: "))["error"]
    assert error["code"] == "deadline_exceeded", error
    assert "deadline" in error["message"]
    [line] = [r.fields for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]
    assert (line["status"], line["reason"]) == (504, "deadline")


async def test_a_stream_of_several_choices_cut_at_its_deadline_says_so(
    gw: InProcessGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As a stream of one choice: `n: 2` past its `x-request-timeout` ends with
    `deadline_exceeded`, recorded with reason `deadline` (it was recorded with none)."""
    stream_hello_then_nothing(gw, monkeypatch)
    caplog.set_level(logging.INFO, "gateway.access")
    async with gw.http(**{"x-request-timeout": "0.3"}) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True, "n": 2})
    assert response.status_code == 200
    last = [line for line in response.text.splitlines() if line.startswith("data: ")][-1]
    assert json.loads(last.removeprefix("data: "))["error"]["code"] == "deadline_exceeded"
    [line] = [r.fields for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]
    assert (line["status"], line["reason"]) == (504, "deadline")


async def test_a_request_that_fell_back_and_failed_there_says_so(
    gw: InProcessGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """llm-large fails, its fallback llm-small fails too: the 502 tells the client of the
    move it made, and the record keeps it (the hostile review of issue 40 found a failed
    fallback recorded as none)."""
    gw.upstream.script("llm-large", UpstreamError(MODEL_FAILED), UpstreamError(MODEL_FAILED))
    gw.upstream.script("llm-small", UpstreamError(MODEL_FAILED))
    caplog.set_level(logging.INFO, "gateway.access")
    async with gw.http() as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.headers["x-gateway-fallback"] == "llm-large->llm-small; reason=replica_error"
    [line] = [r.fields for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]
    assert line["fallbacks"] == ["llm-large->llm-small:replica_error"]


async def test_a_fallback_whose_template_refuses_leaves_the_models_own_failure(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 42's hostile review: llm-large's replicas failed, and its fallback's own
    # template (Mistral's: roles must alternate) refused the conversation; the client
    # was told 400, its messages at fault, of a model it never asked for.
    mistral = (
        Path(__file__).parents[1]
        / "data/tokenizer_configs/mistral-7b-instruct-v0.3/tokenizer_config.json"
    )

    def fallback_with_its_own_template(config: dict[str, Any]) -> None:
        config["models"]["llm-small"]["prompt_template"] = str(mistral)

    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    async with started_gateway(config_for(fallback_with_its_own_template), monkeypatch) as gw:
        records = gw.finished_records()
        for url in LARGE:
            gw.upstream.break_replica(url, unavailable)
        async with gw.http() as client:
            answer = await client.post(
                "/v1/chat/completions", json={"model": "llm-large", "messages": twice}
            )
    assert answer.status_code == 503, answer.text
    assert answer.headers["x-gateway-fallback-refused"] == "llm-small; reason=template"
    assert {c.call.upstream_model for c in gw.upstream.calls} == {"llm-large"}
    [record] = records
    assert "llm-large->llm-small:refused_template" in record.fallbacks
