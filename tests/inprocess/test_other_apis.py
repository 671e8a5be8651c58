"""Legacy completions, embeddings, the Responses API and Anthropic's Messages API: each a
wire onto the one request path, checked with its own SDK where there is one."""

from __future__ import annotations

import numpy as np

from gateway.inference.types import Completion, Delta, RequestKind, Usage, embedding_rows
from tests.inprocess.conftest import InProcessGateway
from tests.inprocess.sse import named_events

HELLO = [{"role": "user", "content": "Hello"}]


# --- /v1/completions --------------------------------------------------------------------


async def test_legacy_completion_sends_the_prompt_as_is(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-large", Completion(" world", usage=Usage(4, 2)))
    answer = await gw.openai().completions.create(model="llm-large", prompt="Hello", max_tokens=8)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == " world"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 2)
    [sent] = gw.upstream.calls
    assert sent.call.kind is RequestKind.COMPLETION
    assert sent.call.prompt == "Hello"  # no chat template
    assert sent.call.params.max_tokens == 8


async def test_legacy_completion_stream(gw: InProcessGateway) -> None:
    stream = await gw.openai().completions.create(
        model="llm-large",
        prompt="Hello",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello from fake"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (9, 3)


# --- /v1/embeddings ---------------------------------------------------------------------


async def test_embeddings_are_the_upstreams_vectors(gw: InProcessGateway) -> None:
    rows = embedding_rows([0.5, -1.0, 2.0, 0.25, 1.0, 0.0, -0.5, 3.0], 2)
    gw.upstream.script("embed-small", Completion("", usage=Usage(prompt_tokens=6), vectors=rows))
    answer = await gw.openai().embeddings.create(
        model="embed-small", input=["first", "second"], encoding_format="float"
    )
    assert [d.index for d in answer.data] == [0, 1]
    assert [d.embedding for d in answer.data] == rows.tolist()
    assert answer.usage.prompt_tokens == 6
    [sent] = gw.upstream.calls
    assert sent.call.kind is RequestKind.EMBEDDING
    assert sent.call.inputs == ("first", "second")


async def test_embeddings_as_base64(gw: InProcessGateway) -> None:
    rows = embedding_rows([0.5, -1.0, 2.0, 0.25], 1)
    gw.upstream.script("embed-small", Completion("", usage=Usage(prompt_tokens=1), vectors=rows))
    # The SDK asks for base64 by default and decodes it to floats itself.
    answer = await gw.openai().embeddings.create(model="embed-small", input="only one")
    assert np.allclose(answer.data[0].embedding, rows[0])


async def test_a_long_input_list_is_split_into_batches(gw: InProcessGateway) -> None:
    texts = [f"text {i}" for i in range(10)]  # max_batch is 8 in the test config
    answer = await gw.openai().embeddings.create(
        model="embed-small", input=texts, encoding_format="float"
    )
    sent = sorted((c.call.inputs for c in gw.upstream.calls), key=len, reverse=True)
    assert sent == [tuple(texts[:8]), tuple(texts[8:])]
    assert [d.index for d in answer.data] == list(range(10))
    # The fake's vectors count 0, 1, 2... within each batch: batch order is kept.
    assert answer.data[8].embedding == [0.0, 1.0, 2.0, 3.0]
    assert answer.data[7].embedding == [28.0, 29.0, 30.0, 31.0]
    assert answer.usage.prompt_tokens == 3 * 10  # both batches' usage, summed


async def test_chat_on_an_embedding_model_is_400(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        wrong = await client.post(
            "/v1/chat/completions", json={"model": "embed-small", "messages": HELLO}
        )
        also_wrong = await client.post(
            "/v1/embeddings", json={"model": "llm-large", "input": "text"}
        )
    assert wrong.status_code == also_wrong.status_code == 400
    assert wrong.json()["error"]["code"] == "model_not_supported"
    assert also_wrong.json()["error"]["code"] == "model_not_supported"
    assert gw.upstream.calls == []


# --- /v1/responses ----------------------------------------------------------------------


async def test_responses_answer_through_the_sdk(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-large", Completion("Fine, thanks.", usage=Usage(12, 4)))
    raw = await gw.openai().responses.with_raw_response.create(
        model="llm-large", input="How are you?", instructions="Be polite.", max_output_tokens=20
    )
    answer = raw.parse()
    assert answer.status == "completed"
    assert answer.output_text == "Fine, thanks."
    assert answer.id == raw.headers["x-request-id"]
    assert answer.usage is not None
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (12, 4)
    assert answer.usage.total_tokens == 16
    [sent] = gw.upstream.calls
    assert "<|im_start|>system\nBe polite.<|im_end|>" in sent.call.prompt
    assert "How are you?" in sent.call.prompt
    assert sent.call.params.max_tokens == 20


async def test_responses_stream_events(gw: InProcessGateway) -> None:
    gw.upstream.script(
        "llm-large", [Delta(text="Fine", input_tokens=8), Delta(text=", thanks.", output_tokens=2)]
    )
    stream = await gw.openai().responses.create(model="llm-large", input="Hi", stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "Fine, thanks."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "Fine, thanks."
    assert completed.usage is not None
    assert (completed.usage.input_tokens, completed.usage.output_tokens) == (8, 3)


async def test_a_stored_response_is_retrieved_and_continued(gw: InProcessGateway) -> None:
    client = gw.openai()
    gw.upstream.script("llm-large", Completion("Paris.", usage=Usage(5, 1)))
    first = await client.responses.create(model="llm-large", input="Capital of France?")
    again = await client.responses.retrieve(first.id)
    assert again.output_text == "Paris."
    await client.responses.create(
        model="llm-large", input="And of Italy?", previous_response_id=first.id
    )
    # The follow-up went upstream with the whole conversation, the stored answer included.
    prompt = gw.upstream.calls[-1].call.prompt
    assert prompt.index("Capital of France?") < prompt.index("Paris.")
    assert prompt.index("Paris.") < prompt.index("And of Italy?")


# --- /v1/messages -----------------------------------------------------------------------


async def test_messages_answer_through_the_sdk(gw: InProcessGateway) -> None:
    gw.upstream.script("llm-large", Completion("Bonjour.", usage=Usage(10, 3)))
    raw = await gw.anthropic().messages.with_raw_response.create(
        model="llm-large",
        max_tokens=32,
        system="Answer in French.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    message = await raw.parse()
    assert message.id == raw.headers["x-request-id"]
    assert message.role == "assistant"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Bonjour."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (10, 3)
    [sent] = gw.upstream.calls
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in sent.call.prompt
    assert sent.call.params.max_tokens == 32


async def test_messages_cut_at_max_tokens_says_so(gw: InProcessGateway) -> None:
    message = await gw.anthropic().messages.create(
        model="llm-large", max_tokens=3, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message.stop_reason == "max_tokens"  # the fake's three tokens


async def test_messages_stream_through_the_sdk(gw: InProcessGateway) -> None:
    async with gw.anthropic().messages.stream(
        model="llm-large", max_tokens=32, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hello from fake"
    assert final.content[0].text == "Hello from fake"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3


async def test_a_messages_streams_input_tokens_are_the_upstreams(gw: InProcessGateway) -> None:
    # `message_start` can only carry the gateway's estimate (the prompt has not been
    # counted upstream yet); the final usage is what the upstream counted and charged.
    gw.upstream.script(
        "llm-large",
        [Delta(text="Hi", input_tokens=9, output_tokens=1), Delta(text="!", usage=Usage(9, 2))],
    )
    async with gw.anthropic().messages.stream(
        model="llm-large", max_tokens=32, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        final = await stream.get_final_message()
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 2)


async def test_messages_stream_event_order(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        response = await client.post(
            "/v1/messages",
            json={"model": "llm-large", "max_tokens": 32, "messages": HELLO, "stream": True},
        )
    names = [name for name, _ in named_events(response.text) if name != "ping"]
    assert names[0] == "message_start"
    assert names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = named_events(response.text)[0][1]
    assert start["message"]["id"] == response.headers["x-request-id"]


async def test_messages_unknown_model_is_anthropics_404(gw: InProcessGateway) -> None:
    async with gw.http() as client:
        response = await client.post(
            "/v1/messages",
            json={"model": "claude-nothing", "max_tokens": 8, "messages": HELLO},
            headers={"x-api-key": "sk-test-acme"},
        )
    assert response.status_code == 404
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "claude-nothing" in body["error"]["message"]


async def test_a_messages_answer_carries_the_request_id_the_sdk_reads(
    gw: InProcessGateway,
) -> None:
    message = await gw.anthropic().messages.create(
        model="llm-large", max_tokens=32, messages=[{"role": "user", "content": "Hello"}]
    )
    assert message._request_id == message.id  # type: ignore[attr-defined]
