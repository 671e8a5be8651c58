"""The OpenAI response shapes the SDKs parse."""

from __future__ import annotations

import orjson

from gateway.api.errors import APIError
from gateway.api.responses import SSE_DONE, ChunkWriter, completion_body, sse_error
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
            CHAT,
            Completion("hello", Usage(3, 1), "stop"),
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
    body = orjson.loads(completion_body(TEXT, Completion("x"), response_id="cmpl-1", model="m"))
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
