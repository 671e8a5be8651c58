"""Chat completions (`/v1/chat/completions`) through the whole request path, in process.

Why these tests exist: the hot path (gateway/api/exchange.py, serving/conductor.py, app.py,
serving/runtime.py, serving/dispatch.py) had only end-to-end tests, which start real
gateway processes, Redis and Triton. Here the app is built with `build_app`, its lifespan
run, and called through ASGI, with a scripted fake in place of every backend: a refactor
of the request path is checked in seconds, and what went upstream can be asserted.
"""

from __future__ import annotations

import orjson

from gateway.inference.types import Completion, Delta, RequestKind, Usage
from tests.inprocess.conftest import InProcessGateway
from tests.inprocess.sse import data_events

HELLO = [{"role": "user", "content": "Hello there"}]


async def test_answer_usage_and_id_are_the_upstreams(gw: InProcessGateway) -> None:
    gw.upstream.script(
        "llm-large",
        Completion("Hi, I am fake.", usage=Usage(prompt_tokens=11, completion_tokens=7)),
    )
    client = gw.openai()
    raw = await client.chat.completions.with_raw_response.create(
        model="llm-large", messages=HELLO, max_tokens=32, temperature=0.25, seed=7
    )
    answer = raw.parse()
    assert answer.object == "chat.completion"
    assert answer.model == "llm-large"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "Hi, I am fake."
    assert answer.choices[0].finish_reason == "stop"
    usage = answer.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (11, 7, 18)
    # The id a client quotes is the one the gateway logs.
    assert raw.headers["x-request-id"] == answer.id
    assert answer.id.startswith("chatcmpl-")
    assert raw.headers["x-gateway-queue-ms"].isdigit()


async def test_what_goes_upstream_is_the_rendered_prompt_and_sampling(
    gw: InProcessGateway,
) -> None:
    client = gw.openai()
    await client.chat.completions.create(
        model="llm-large",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        max_tokens=32,
        temperature=0.25,
        top_p=0.5,
        seed=7,
        stop=["END"],
    )
    [sent] = gw.upstream.calls
    assert sent.mode == "complete"
    assert sent.url in ("http://large-a", "http://large-b")
    call = sent.call
    assert call.kind is RequestKind.CHAT
    assert call.upstream_model == "llm-large"
    # A Triton model gets the prompt its template renders (chatml here).
    assert "<|im_start|>system\nBe brief.<|im_end|>" in call.prompt
    assert "<|im_start|>user\nHello there<|im_end|>" in call.prompt
    assert call.prompt.endswith("<|im_start|>assistant\n")
    params = call.params
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (32, 0.25, 0.5, 7)
    assert params.stop == ("END",)


async def test_max_tokens_defaults_to_the_models(gw: InProcessGateway) -> None:
    await gw.openai().chat.completions.create(model="llm-small", messages=HELLO)
    [sent] = gw.upstream.calls
    assert sent.call.params.max_tokens == 64  # max_tokens_default in the test config


async def test_openai_upstream_gets_the_messages_under_its_own_model_name(
    gw: InProcessGateway,
) -> None:
    answer = await gw.openai().chat.completions.create(model="relay", messages=HELLO)
    [sent] = gw.upstream.calls
    assert sent.url == "http://relay-a/v1"
    assert sent.call.upstream_model == "relayed-model"
    assert sent.call.prompt == ""  # the server renders the messages itself
    assert [(m.role, m.content) for m in sent.call.messages] == [("user", "Hello there")]
    assert answer.model == "relay"  # the client sees the name it asked for


async def test_an_alias_is_served_by_its_model_and_answered_under_its_name(
    gw: InProcessGateway,
) -> None:
    answer = await gw.openai().chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert answer.model == "llm-large"
    assert [c.call.upstream_model for c in gw.upstream.calls] == ["llm-large"]


async def test_stream_through_the_sdk(gw: InProcessGateway) -> None:
    gw.upstream.script(
        "llm-large",
        [
            Delta(text="One", input_tokens=5),
            Delta(text=", two"),
            Delta(text=", three.", usage=Usage(prompt_tokens=5, completion_tokens=3)),
        ],
    )
    stream = await gw.openai().chat.completions.create(
        model="llm-large", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "One, two, three."
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert all(f is None for f in finishes[:-1])
    assert len({c.id for c in chunks}) == 1
    # The usage chunk comes last, with no choices, and says what the upstream reported.
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 3)
    assert [c.mode for c in gw.upstream.calls] == ["stream"]


async def test_stream_wire_format(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "llm-large", "messages": HELLO, "stream": True},
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    payloads = data_events(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["id"] for c in chunks} == {response.headers["x-request-id"]}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == (
        "Hello from fake"
    )
    # No usage chunk unless `stream_options.include_usage` asks for it.
    assert all("usage" not in c or c["usage"] is None for c in chunks)


async def test_stream_that_reaches_max_tokens_finishes_with_length(gw: InProcessGateway) -> None:
    stream = await gw.openai().chat.completions.create(
        model="llm-large", messages=HELLO, stream=True, max_tokens=3
    )
    finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "length"  # the fake's three tokens reached max_tokens


async def test_n_choices_are_separate_upstream_calls(gw: InProcessGateway) -> None:
    answer = await gw.openai().chat.completions.create(
        model="llm-large", messages=HELLO, n=3, seed=10
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    seeds = sorted(c.call.params.seed for c in gw.upstream.calls)
    assert seeds == [10, 11, 12]  # choice i is sampled with seed + i
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 3 * 3  # each choice's usage, summed
