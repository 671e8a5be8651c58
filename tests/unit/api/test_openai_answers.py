"""The OpenAI response shapes the SDKs parse."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import numpy as np
import orjson

from gateway.api.errors import APIError
from gateway.api.openai.openai_answers import (
    SSE_DONE,
    ChunkWriter,
    completion_body,
    embeddings_body,
    sse_error,
)
from gateway.inference.types import (
    ChatMessage,
    Completion,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    Usage,
)

CHAT = InferenceRequest(
    kind=RequestKind.CHAT,
    model="m",
    params=SamplingParams(max_tokens=4),
    messages=(ChatMessage("user", "hi"),),
)
TEXT = InferenceRequest(
    kind=RequestKind.COMPLETION, model="m", params=SamplingParams(4), prompt="p"
)


def event(raw: bytes) -> dict[str, object]:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    data: dict[str, object] = orjson.loads(raw[6:])
    return data


def test_chat_body_has_message_usage_and_served_model() -> None:
    body = orjson.loads(
        completion_body(
            [CHAT],
            [Completion("hello", Usage(3, 1), "stop")],
            response_id="chatcmpl-1",
            model="llm-small",
        )
    )
    assert body["object"] == "chat.completion"
    assert body["model"] == "llm-small"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_text_completion_body_has_text() -> None:
    body = orjson.loads(completion_body([TEXT], [Completion("x")], response_id="cmpl-1", model="m"))
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "x"


def test_chat_chunks_send_the_role_once_then_finish_then_usage() -> None:
    writer = ChunkWriter(CHAT, response_id="chatcmpl-1", model="m")
    first, second = event(writer.text("a")), event(writer.text("b"))
    finish, usage = event(writer.finish("length")), event(writer.usage(Usage(2, 2)))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}  # type: ignore[index]
    assert second["choices"][0]["delta"] == {"content": "b"}  # type: ignore[index]
    assert finish["choices"][0]["delta"] == {}  # type: ignore[index]
    assert finish["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert {first["id"], second["id"], finish["id"], usage["id"]} == {"chatcmpl-1"}
    assert first["object"] == "chat.completion.chunk"


def test_an_empty_stream_still_names_the_assistant() -> None:
    writer = ChunkWriter(CHAT, response_id="c", model="m")
    delta = event(writer.finish("stop"))["choices"][0]["delta"]  # type: ignore[index]
    assert delta == {"role": "assistant", "content": ""}


def test_error_event_has_the_openai_error_shape() -> None:
    raw = sse_error(APIError(502, "boom", type="server_error").body())
    assert event(raw) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": None}
    }
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    response = APIError(503, "busy", retry_after_s=0.2).response()
    assert response.headers["retry-after"] == "1"
    assert APIError(503, "busy", retry_after_s=2.5).response().headers["retry-after"] == "3"


def test_choices_are_indexed_in_order_and_usage_is_their_sum() -> None:
    parts = [TEXT, dataclasses.replace(TEXT, prompt="q", echo=True)]
    body = orjson.loads(
        completion_body(
            parts,
            [Completion("a", Usage(1, 2)), Completion("b", Usage(3, 4), "length")],
            response_id="cmpl-1",
            model="m",
        )
    )
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "a", "stop"),
        (1, "qb", "length"),  # echo: the prompt, then the completion
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}


def test_each_choice_of_a_stream_gets_the_role_on_its_own_first_chunk() -> None:
    writer = ChunkWriter(CHAT, response_id="chatcmpl-1", model="m")
    first, other, again = (
        event(writer.text("a", index=0)),
        event(writer.text("b", index=1)),
        event(writer.text("c", index=1)),
    )
    assert [e["choices"][0]["index"] for e in (first, other, again)] == [0, 1, 1]  # type: ignore[index]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}  # type: ignore[index]
    assert other["choices"][0]["delta"] == {"role": "assistant", "content": "b"}  # type: ignore[index]
    assert again["choices"][0]["delta"] == {"content": "c"}  # type: ignore[index]
    finish = event(writer.finish("stop", index=1))
    assert finish["choices"] == [
        {"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    ]


EMBED = InferenceRequest(
    kind=RequestKind.EMBEDDING, model="e", params=SamplingParams(0), inputs=("a", "b")
)
VECTORS = np.array([[0.6, 0.8], [1.0, -0.0]], dtype=np.float32)


def embedded(request: InferenceRequest) -> Any:
    answer = Completion("", Usage(5), vectors=VECTORS)
    return orjson.loads(embeddings_body([request], [answer], response_id="embd-1", model="e"))


def test_embeddings_body_has_a_vector_per_input_as_numbers() -> None:
    body = embedded(EMBED)
    assert body["object"] == "list" and body["model"] == "e"
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    assert np.allclose([d["embedding"] for d in body["data"]], VECTORS)
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


def test_embeddings_body_in_base64_is_little_endian_float32() -> None:
    body = embedded(dataclasses.replace(EMBED, base64=True))
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    assert np.array_equal(decoded, VECTORS)
