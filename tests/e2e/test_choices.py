"""Several choices in one request, with the official SDK as the client: `n` on chat and
text completions, streamed and not, a text completion of a list of prompts, `echo`;
each choice is a request of its own to the replicas, charged and admitted as one."""

from __future__ import annotations

from collections import defaultdict

import pytest
from openai import BadRequestError, OpenAI

from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from gateway_tools.dev.sim.model_template import generate_pieces
from tests.e2e.stack import Gateway, replica_requests

ASK = [{"role": "user", "content": "Say something."}]
CHATML = PromptTemplate("chatml")


def chat_answer(seed: int, max_tokens: int = 8) -> str:
    prompt = CHATML.render([ChatMessage("user", "Say something.")])
    return "".join(generate_pieces(prompt.encode(), max_tokens, seed))


def text_answer(prompt: str, seed: int | None = None, max_tokens: int = 8) -> str:
    return "".join(generate_pieces(prompt.encode(), max_tokens, seed))


@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_n_choices_each_the_answer_of_its_seed(acme: OpenAI, model: str) -> None:
    reply = acme.chat.completions.create(model=model, messages=ASK, n=3, seed=7, max_tokens=8)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    if model != "relay":  # the relay's own gateway renders the same prompt: same texts
        assert [c.message.content for c in reply.choices] == [chat_answer(s) for s in (7, 8, 9)]
    texts = {c.message.content for c in reply.choices}
    assert len(texts) == 3  # seeds 7, 8, 9: three different samples
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3 * 8


def test_streamed_choices_interleave_and_each_finishes(acme: OpenAI) -> None:
    stream = acme.chat.completions.create(
        model="llm-large", messages=ASK, n=2, seed=1, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, str] = {}
    roles: dict[int, int] = defaultdict(int)
    usage = None
    order = []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            order.append(choice.index)
            texts[choice.index] += choice.delta.content or ""
            roles[choice.index] += choice.delta.role == "assistant"
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert dict(texts) == {0: chat_answer(1), 1: chat_answer(2)}
    assert finishes == {0: "length", 1: "length"}
    assert dict(roles) == {0: 1, 1: 1}  # the role once per choice, on its first chunk
    # Pieces of the two choices arrive as they are made, not one choice after the other.
    assert order != sorted(order)
    assert usage is not None and usage.completion_tokens == 16


def test_choices_go_to_different_replicas(acme: OpenAI, gateway: Gateway) -> None:
    before = replica_requests(gateway, "llm-large")
    acme.chat.completions.create(model="llm-large", messages=ASK, n=2, max_tokens=4)
    after = replica_requests(gateway, "llm-large")
    assert sorted(after[url] - before.get(url, 0) for url in after) == [1, 1]


@pytest.mark.parametrize("stream", [False, True])
def test_a_list_of_prompts_gets_its_choices_indexed_across_prompts_and_n(
    acme: OpenAI, stream: bool
) -> None:
    prompts = ["Once upon a time", "The weather today"]
    expected = {
        0: text_answer(prompts[0], 3),
        1: text_answer(prompts[0], 4),
        2: text_answer(prompts[1], 3),
        3: text_answer(prompts[1], 4),
    }
    if not stream:
        reply = acme.completions.create(
            model="llm-small", prompt=prompts, n=2, seed=3, max_tokens=8
        )
        assert {c.index: c.text for c in reply.choices} == expected
        return
    texts: dict[int, str] = defaultdict(str)
    for chunk in acme.completions.create(
        model="llm-small", prompt=prompts, n=2, seed=3, max_tokens=8, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert dict(texts) == expected


@pytest.mark.parametrize("stream", [False, True])
def test_echo_starts_the_text_with_its_prompt(acme: OpenAI, stream: bool) -> None:
    prompt = "Once upon a time"
    if stream:
        text = "".join(
            chunk.choices[0].text
            for chunk in acme.completions.create(
                model="llm-small", prompt=prompt, echo=True, max_tokens=8, stream=True
            )
            if chunk.choices
        )
    else:
        reply = acme.completions.create(model="llm-small", prompt=prompt, echo=True, max_tokens=8)
        text = reply.choices[0].text
    assert text == prompt + text_answer(prompt)


def test_best_of_more_than_n_and_suffix_are_refused_by_name(acme: OpenAI) -> None:
    for fields, param in (({"best_of": 3, "n": 2}, "best_of"), ({"suffix": "end"}, "suffix")):
        with pytest.raises(BadRequestError) as caught:
            acme.completions.create(model="llm-small", prompt="x", **fields)  # type: ignore[call-overload]
        assert caught.value.param == param


def test_a_client_leaving_a_stream_of_choices_ends_every_choice(
    acme: OpenAI, gateway: Gateway
) -> None:
    stream = acme.chat.completions.create(
        model="llm-large", messages=ASK, n=3, max_tokens=64, stream=True
    )
    next(iter(stream))
    request_id = stream.response.headers["x-request-id"]
    stream.close()
    record = gateway.access_record(request_id)
    assert record["status"] == 499
    assert "Traceback" not in gateway.log
