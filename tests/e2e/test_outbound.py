"""Outbound sanitization on a real gateway: what an external model receives, per tenant
policy, for every message part, streamed or not (gateway.serving.outbound)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from openai import BadRequestError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import Gateway, model, running_gateway, tenant
from tests.e2e.test_openai_api import fetch_text
from tests.e2e.upstreams import no_models, serve_in_thread

SECRET = "sk-proj-Zx81Qw0aLm2Pq9"
EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
HOST = "pg1.corp.example.com"
PROMPT = f"Email {EMAIL} the card {CARD}; the DB is {HOST}, key {SECRET}."
MASKED = "Email [EMAIL_1] the card [CARD_1]; the DB is [HOST_1], key [API_KEY_1]."


class Recorder:
    """An OpenAI-style upstream that keeps every body it receives."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", no_models)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = "messages" in body
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            choice.update(
                {"message": {"role": "assistant", "content": "ok"}} if chat else {"text": "ok"}
            )
            return web.json_response(
                {"id": "x", "object": "x", "created": 0, "model": "m", "choices": [choice]}
            )
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        piece = {"delta": {"content": "ok"}} if chat else {"text": "ok"}
        chunk = {
            "id": "x",
            "object": "x",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, **piece, "finish_reason": "stop"}],
        }
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
        return response

    def last_texts(self) -> list[str]:
        body = self.bodies[-1]
        if "prompt" in body:
            return [body["prompt"]]
        return [m["content"] for m in body["messages"]]


@pytest.fixture(scope="module")
def recorders() -> Iterator[tuple[Recorder, Recorder, list[str]]]:
    hosted, local = Recorder(), Recorder()
    with serve_in_thread([hosted.app(), local.app()]) as urls:
        yield hosted, local, urls


@pytest.fixture(scope="module")
def gateway(
    recorders: tuple[Recorder, Recorder, list[str]],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    _, _, urls = recorders
    models = {
        "hosted": model("openai", [urls[0]], external=True),  # outbound: mask (default)
        "local": model("openai", [urls[1]]),
    }
    tenants = {
        "acme": tenant("acme", ["*"]),
        "strict": tenant("strict", ["*"], outbound={"policy": "block"}),
        "trusted": tenant("trusted", ["*"], outbound={"models": {"hosted": "off"}}),
    }
    with running_gateway(
        tmp_path_factory.mktemp("outbound"),
        models,
        redis_url,
        tenants=tenants,
        gateway={"outbound": {"internal_domains": ["corp.example.com"]}},
    ) as gw:
        yield gw


def client(gateway: Gateway, name: str) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=f"sk-test-{name}", max_retries=0)


def findings(gateway: Gateway, policy: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(fetch_text(f"{gateway.ops_url}/metrics")):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "gateway_outbound_findings_total" and labels["policy"] == policy:
                counts[labels["category"]] = counts.get(labels["category"], 0) + sample.value
    return counts


@pytest.mark.parametrize("stream", [False, True])
def test_every_message_part_is_masked_before_it_leaves(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]], stream: bool
) -> None:
    hosted, _, _ = recorders
    messages: list[Any] = [
        {"role": "system", "content": f"Ops contact: {EMAIL}."},
        {"role": "user", "content": [{"type": "text", "text": PROMPT}]},
        {"role": "assistant", "content": f"Noted {HOST}."},
        {"role": "user", "content": "Thanks"},
    ]
    reply = client(gateway, "acme").chat.completions.create(
        model="hosted", messages=messages, stream=stream
    )
    text = (
        "".join(c.choices[0].delta.content or "" for c in reply)
        if stream
        else reply.choices[0].message.content
    )
    assert text == "ok"
    assert hosted.last_texts() == ["Ops contact: [EMAIL_1].", MASKED, "Noted [HOST_1].", "Thanks"]
    assert all(
        value not in orjson.dumps(hosted.bodies[-1]).decode()
        for value in (SECRET, EMAIL, CARD, HOST)
    )


def test_a_completion_prompt_is_masked(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]]
) -> None:
    hosted, _, _ = recorders
    client(gateway, "acme").completions.create(model="hosted", prompt=PROMPT)
    assert hosted.last_texts() == [MASKED]


def test_block_refuses_with_the_categories_and_sends_nothing(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]]
) -> None:
    hosted, _, _ = recorders
    sent = len(hosted.bodies)
    before = findings(gateway, "block")
    with pytest.raises(BadRequestError) as refused:
        client(gateway, "strict").chat.completions.create(
            model="hosted", messages=[{"role": "user", "content": PROMPT}]
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "sensitive_data_blocked"
    assert "api_key, card, email, host" in error["message"]
    assert all(value not in str(error) for value in (SECRET, EMAIL, CARD, HOST))
    assert len(hosted.bodies) == sent  # nothing left the cluster
    after = findings(gateway, "block")
    assert {c: after[c] - before.get(c, 0) for c in after} == {
        "api_key": 1,
        "card": 1,
        "email": 1,
        "host": 1,
    }
    # The audit line says what was found, never the values.
    audit = [line for line in gateway.log.splitlines() if '"gateway.audit"' in line]
    assert audit and '"policy":"block"' in audit[-1] and '"tenant":"strict"' in audit[-1]
    assert all(value not in gateway.log for value in (SECRET, EMAIL, CARD, HOST))


def test_off_for_a_tenant_and_internal_models_send_as_is(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]]
) -> None:
    hosted, local, _ = recorders
    client(gateway, "trusted").chat.completions.create(
        model="hosted", messages=[{"role": "user", "content": PROMPT}]
    )
    assert hosted.last_texts() == [PROMPT]
    client(gateway, "strict").chat.completions.create(
        model="local", messages=[{"role": "user", "content": PROMPT}]
    )
    assert local.last_texts() == [PROMPT]
