"""An upstream that fails tells the client what kind of failure it was, in a plain
sentence, never the HTTP library's or the model's own text: a stream cut in the middle
(aiohttp's "ClientPayloadError: Response payload is not completed: <TransferEncoding
Error ...>"), a Triton model's Python traceback in an error event, an answer that is not
JSON. That text goes to the gateway's log instead.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway_tools.dev.processes import stop
from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway
from tests.e2e.upstreams import chat_upstream, serve_in_thread

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/models/llm/1/model.py", line 331, in execute\n'
    "    tokens = self.engine.generate(prompt)\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered"
)
# What the libraries and the model said, none of which a client may see.
LEAKS = ("ClientPayloadError", "TransferEncoding", "Traceback", "model.py", "CUDA", "JSONDecode")


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def cut_mid_stream(request: web.Request) -> web.StreamResponse:
    """An OpenAI upstream whose stream stops after one chunk: the connection closes
    without the chunked encoding's end."""
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=b"<html>not JSON</html>", content_type="text/html")
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    delta = {"role": "assistant", "content": "Hel"}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    await response.write(event({**chunk, "choices": [{"index": 0, "delta": delta}]}))
    assert request.transport is not None
    request.transport.close()
    return response


async def triton_ready(request: web.Request) -> web.Response:
    return web.Response()


async def triton_generate_stream(request: web.Request) -> web.StreamResponse:
    """Triton's generate_stream: a piece, then the model's failure as an error event."""
    await request.read()
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(event({"text_output": "Hel"}))
    await response.write(event({"error": TRACEBACK}))
    await response.write_eof()
    return response


async def triton_generate(request: web.Request) -> web.Response:
    """Triton's generate: the model's failure before any output."""
    await request.read()
    return web.json_response({"error": TRACEBACK})


def triton_upstream() -> web.Application:
    app = web.Application()
    app.router.add_get("/v2/models/{model}/ready", triton_ready)
    app.router.add_post("/v2/models/{model}/generate_stream", triton_generate_stream)
    app.router.add_post("/v2/models/{model}/generate", triton_generate)
    return app


@pytest.fixture(scope="module")
def failing(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve_in_thread([chat_upstream(cut_mid_stream), triton_upstream()]) as (cut, tri):
        gateway = start_gateway(
            tmp_path_factory.mktemp("failing"),
            {
                # One attempt: a replica's failure is not hidden behind a retry.
                "cut": model("openai", [cut], max_attempts=1),
                "tri": model("triton_http", [tri], max_attempts=1),
            },
            redis_url,
            tenants=default_tenants(["cut", "tri"]),
        )
        try:
            yield gateway
        finally:
            stop(gateway.process)


def post(gateway: Gateway, model_name: str, stream: bool) -> tuple[int, bytes]:
    """Status and body of a chat request."""
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    request = urllib.request.Request(
        f"{gateway.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def error_event(body: bytes) -> dict[str, Any]:
    """The stream's terminal error event, after the pieces that came before it."""
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert b"[DONE]" not in events
    assert b'"content":"Hel"' in events[0]
    last: dict[str, Any] = orjson.loads(events[-1])
    return last["error"]


def assert_no_leak(body: bytes) -> None:
    for leak in LEAKS:
        assert leak.encode() not in body


def test_a_stream_cut_mid_answer_ends_in_a_plain_error_event(failing: Gateway) -> None:
    status, body = post(failing, "cut", stream=True)
    assert status == 200  # the headers went with the first piece
    assert error_event(body)["message"] == (
        "The backend for `cut` failed: the connection to it was lost before the answer "
        "was complete."
    )
    assert_no_leak(body)
    assert "ClientPayloadError" in failing.log  # for the operator


def test_a_model_traceback_mid_stream_ends_in_a_plain_error_event(failing: Gateway) -> None:
    status, body = post(failing, "tri", stream=True)
    assert status == 200
    assert error_event(body)["message"] == (
        "The backend for `tri` failed: the model failed while generating the answer."
    )
    assert_no_leak(body)
    assert "an illegal memory access" in failing.log


def test_a_model_traceback_before_output_is_a_plain_refusal(failing: Gateway) -> None:
    status, body = post(failing, "tri", stream=False)
    assert status == 400
    assert orjson.loads(body)["error"]["message"] == (
        "The backend for `tri` refused the request: the model could not take the request."
    )
    assert_no_leak(body)


def test_an_answer_that_is_not_json_is_a_plain_502(failing: Gateway) -> None:
    status, body = post(failing, "cut", stream=False)
    assert status == 502
    assert orjson.loads(body)["error"]["message"] == (
        "The backend for `cut` failed: it sent an answer the gateway could not read."
    )
    assert_no_leak(body)
