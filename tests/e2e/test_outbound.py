"""Outbound sanitization on a real gateway: what an external model receives, per tenant
policy, for every message part, streamed or not (gateway.serving.outbound), and a table
of evasions, each proved against an upstream that records what it received: a secret
in every field of every API, and in every form the scan reads through."""

from __future__ import annotations

import base64
import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
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
EMBEDDING_DIMENSIONS = 4


class Recorder:
    """An OpenAI-style upstream that keeps every body it receives."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", no_models)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        app.router.add_post("/v1/embeddings", self.embed)
        return app

    async def embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        vector = base64.b64encode(bytes(4 * EMBEDDING_DIMENSIONS)).decode()
        rows = [
            {"object": "embedding", "index": i, "embedding": vector}
            for i in range(len(body["input"]))
        ]
        return web.json_response({"object": "list", "data": rows, "model": "m"})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = "messages" in body
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            # An empty object is what any schema without required properties allows.
            text = "{}" if "response_format" in body else "ok"
            choice.update(
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
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
    capable = {"capabilities": {"tools": True, "structured_outputs": True}}
    embeddings = {"dimensions": EMBEDDING_DIMENSIONS, "max_inputs": 8, "max_input_tokens": 512}
    models = {
        # outbound: mask (the default)
        "hosted": model("openai", [urls[0]], external=True, **capable),
        "hosted-embed": model(
            "openai", [urls[0]], external=True, capabilities={"embeddings": embeddings}
        ),
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


# The evasion table. Each case is a request that carries a secret, in some field of
# some API or in some form; `traces` are what of it must not reach the upstream.
AWS = "AKIAIOSFODNN7EXAMPLE"
AWS_TAIL = "IOSFODNN7EXAMPLE"
MAIL = "jane.doe@example.com"
MAIL_TRACES = ["jane.doe", "doe@example"]
CARD_DIGITS = "4111111111111111"
LOOKUP: Any = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Looks a record up.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}


@dataclass(frozen=True)
class Case:
    api: str  # chat, completions, embeddings, responses, messages
    body: dict[str, Any]
    category: str  # what `block` names
    traces: list[str] = field(default_factory=list)
    # The card's digits must not be there, whatever separates them.
    card: bool = False
    # Whether the field is sent upstream, so that the placeholder shows there.
    sent: bool = True


def chat_with(content: str, **body: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **body}


def tool_schema(prop: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"id": {"type": "string"}, "x": prop}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": schema}}
    return chat_with("Hi", tools=[tool])


def tool_history(arguments: str, result: str, call_id: str = "call_1") -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }
    return {
        "tools": [LOOKUP],
        "messages": [
            {"role": "user", "content": "Find it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ],
    }


def anthropic(**body: Any) -> dict[str, Any]:
    return {"max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}], **body}


def responses(**body: Any) -> dict[str, Any]:
    return {"input": "Hi", "store": False, **body}


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) - 0x21 + 0xFF01) if "!" <= c <= "~" else "\u3000" for c in text)


def tags(text: str) -> str:
    return "".join(chr(0xE0000 + ord(c)) for c in text)


FIELDS = {
    "tool description": Case(
        "chat",
        chat_with(
            "Hi",
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "description": f"Sign with {AWS}.",
                        "parameters": {},
                    },
                }
            ],
        ),
        "api_key",
        [AWS_TAIL],
    ),
    "tool schema: property description": Case(
        "chat", tool_schema({"description": f"Send to {MAIL}"}), "email", MAIL_TRACES
    ),
    "tool schema: enum": Case(
        "chat", tool_schema({"type": "string", "enum": ["nobody", MAIL]}), "email", MAIL_TRACES
    ),
    "tool schema: default": Case(
        "chat", tool_schema({"type": "string", "default": AWS}), "api_key", [AWS_TAIL]
    ),
    "tool schema: examples": Case(
        "chat", tool_schema({"examples": ["4111 1111 1111 1111"]}), "card", card=True
    ),
    "tool schema: a secret by its key's name": Case(
        "chat",
        tool_schema({"type": "string", "default": {"password": "hunter2-horse"}}),
        "password",
        ["hunter2"],
    ),
    "tool-call arguments": Case(
        "chat", tool_history(json.dumps({"email": MAIL}), "done"), "email", MAIL_TRACES
    ),
    "tool result": Case("chat", tool_history("{}", f"The key is {AWS}"), "api_key", [AWS_TAIL]),
    "tool-call id": Case("chat", tool_history("{}", "done", f"call_{AWS}"), "api_key", [AWS_TAIL]),
    "content-block text": Case(
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": f"Key {AWS}"}]}]},
        "api_key",
        [AWS_TAIL],
    ),
    "system message": Case(
        "chat",
        {
            "messages": [
                {"role": "system", "content": f"Ops: {MAIL}"},
                {"role": "user", "content": "Hi"},
            ]
        },
        "email",
        MAIL_TRACES,
    ),
    "stop sequence": Case("chat", chat_with("Hi", stop=[MAIL]), "email", MAIL_TRACES),
    "user": Case("chat", chat_with("Hi", user=MAIL), "email", MAIL_TRACES, sent=False),
    "response_format schema": Case(
        "chat",
        chat_with(
            "Hi",
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "r",
                    "schema": {"type": "object", "properties": {"a": {"enum": [AWS]}}},
                },
            },
        ),
        "api_key",
        [AWS_TAIL],
    ),
    "completions prompt": Case("completions", {"prompt": f"Key {AWS}"}, "api_key", [AWS_TAIL]),
    "embeddings input": Case(
        "embeddings", {"input": ["cat", f"mail {MAIL}"]}, "email", MAIL_TRACES
    ),
    "Responses instructions": Case(
        "responses", responses(instructions=f"Contact {MAIL}."), "email", MAIL_TRACES
    ),
    "Responses metadata": Case(
        "responses", responses(metadata={"note": f"key {AWS}"}), "api_key", [AWS_TAIL], sent=False
    ),
    "Responses function call output": Case(
        "responses",
        responses(
            tools=[{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
            input=[
                {"type": "message", "role": "user", "content": "Find it"},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": f"Mail {MAIL}"},
            ],
        ),
        "email",
        MAIL_TRACES,
    ),
    "Anthropic system block": Case(
        "messages",
        anthropic(system=[{"type": "text", "text": f"Key {AWS}"}]),
        "api_key",
        [AWS_TAIL],
    ),
    "Anthropic tool_use input": Case(
        "messages",
        anthropic(
            tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
            messages=[
                {"role": "user", "content": "Find it"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "lookup",
                            "input": {"email": MAIL},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"},
                    ],
                },
            ],
        ),
        "email",
        MAIL_TRACES,
    ),
    "Anthropic stop_sequences": Case(
        "messages", anthropic(stop_sequences=[MAIL]), "email", MAIL_TRACES
    ),
    "Anthropic metadata.user_id": Case(
        "messages", anthropic(metadata={"user_id": MAIL}), "email", MAIL_TRACES, sent=False
    ),
}


def form(text: str, category: str, *traces: str, card: bool = False) -> Case:
    """A chat message that holds `text` (the secret in some form)."""
    return Case("chat", chat_with(f"Use {text} please"), category, [text, *traces], card=card)


FORMS = {
    "AWS key, zero-width space inside": form("AKIA\u200bIOSFODNN7EXAMPLE", "api_key", AWS_TAIL),
    "AWS key, soft hyphen and bidi override inside": form(
        "AKIA\u00adIOSF\u202eODNN7EXAMPLE", "api_key", "ODNN7EXAMPLE"
    ),
    "AWS key, combining marks over letters": form(
        "A\u0301KIAIOSFODNN7EXAMPLE", "api_key", AWS_TAIL
    ),
    "AWS key, Greek capitals": form(
        "\u0391\u039a\u0399\u0391IOSFODNN7EXAMPLE", "api_key", AWS_TAIL
    ),
    "AWS key, fullwidth letters": form(fullwidth(AWS), "api_key", AWS_TAIL),
    "AWS key, tag characters": form(tags(AWS), "api_key"),
    "AWS key, JSON-escaped \\u0041KIA": form("\\u0041KIAIOSFODNN7EXAMPLE", "api_key", AWS_TAIL),
    "AWS key, HTML entity": form("&#65;KIAIOSFODNN7EXAMPLE", "api_key", AWS_TAIL),
    "AWS key, base64": form(base64.b64encode(AWS.encode()).decode(), "api_key", AWS),
    "AWS key, hex": form(AWS.encode().hex(), "api_key", AWS),
    "AWS key, base64 of base64": form(
        base64.b64encode(base64.b64encode(AWS.encode())).decode(), "api_key", AWS
    ),
    "e-mail, Cyrillic \u0430": form("jane.doe@ex\u0430mple.com", "email", *MAIL_TRACES),
    "e-mail, percent-encoded @": form("jane.doe%40example.com", "email", *MAIL_TRACES),
    "e-mail, base64url of a sentence": form(
        base64.urlsafe_b64encode(f"write to {MAIL} ??>".encode()).decode(), "email", *MAIL_TRACES
    ),
    "card, odd separators": form("4111 . 1111 / 1111 _ 1111", "card", card=True),
    "card, middle dots": form("4111\u00b71111\u00b71111\u00b71111", "card", card=True),
    "card, fullwidth digits": form(fullwidth("4111 1111 1111 1111"), "card", card=True),
    "SSN, dots": form("123.45.6789", "ssn", "6789"),
    "phone, dots": form("555.123.4567", "phone", "4567"),
}


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from strings(child)


def send(gateway: Gateway, tenant_name: str, case: Case) -> httpx.Response:
    paths = {
        "chat": "/v1/chat/completions",
        "completions": "/v1/completions",
        "embeddings": "/v1/embeddings",
        "responses": "/v1/responses",
        "messages": "/v1/messages",
    }
    model = "hosted-embed" if case.api == "embeddings" else "hosted"
    return httpx.post(
        gateway.url + paths[case.api],
        json={"model": model, **case.body},
        headers={"authorization": f"Bearer sk-test-{tenant_name}"},
        timeout=30,
    )


CASES = {**FIELDS, **FORMS}


@pytest.mark.parametrize("name", list(CASES))
def test_mask_leaves_no_trace_upstream(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]], name: str
) -> None:
    hosted, _, _ = recorders
    case = CASES[name]
    sent = len(hosted.bodies)
    reply = send(gateway, "acme", case)
    assert reply.status_code == 200, reply.text
    assert len(hosted.bodies) == sent + 1
    received = "\n".join(strings(hosted.bodies[-1]))
    for trace in case.traces:
        assert trace not in received
    if case.card:
        digits = "".join(str(unicodedata.digit(c)) for c in received if c.isdigit())
        assert CARD_DIGITS not in digits
    if case.sent:  # masked, not dropped: the model still sees that something was there
        assert f"[{case.category.upper()}_" in received


@pytest.mark.parametrize("name", list(CASES))
def test_block_refuses_and_sends_nothing(
    gateway: Gateway, recorders: tuple[Recorder, Recorder, list[str]], name: str
) -> None:
    hosted, _, _ = recorders
    case = CASES[name]
    sent = len(hosted.bodies)
    reply = send(gateway, "strict", case)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "was not sent to `hosted" in message and case.category in message
    assert all(trace not in reply.text for trace in case.traces)
    assert len(hosted.bodies) == sent  # nothing left the cluster
