"""An OpenAI-compatible upstream that calls tools as a model does: offered tools and no
tool result yet, it calls the first (or the forced) tool; given a result, it answers in
text. Asked for a `response_format`, it answers JSON of the wrong shape. Streamed, a
call comes as OpenAI sends it: id and name first, then its arguments in pieces. Every
body it receives is kept."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.e2e.upstreams import no_models

ARGUMENT_PIECES = ('{"city": ', '"Paris", ', '"unit": "C"}')


class ToolModel:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", no_models)
        app.router.add_post("/v1/chat/completions", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        last = body["messages"][-1]
        call = None
        if body.get("tools") and last["role"] != "tool" and body.get("tool_choice") != "none":
            forced = body.get("tool_choice")
            name = forced["function"]["name"] if isinstance(forced, dict) else None
            call = {
                "id": f"call_{len(self.bodies)}",
                "name": name or body["tools"][0]["function"]["name"],
            }
        text = f"The tool said: {last['content']}" if last["role"] == "tool" else "No tool needed."
        if body.get("response_format"):
            text = '{"wrong": "shape"}'  # valid JSON that no schema in the tests allows
        usage = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = "stop"
            if call is not None:
                arguments = "".join(ARGUMENT_PIECES)
                function = {"name": call["name"], "arguments": arguments}
                tool_call = {"id": call["id"], "type": "function", "function": function}
                message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
                finish = "tool_calls"
            choice = {"index": 0, "message": message, "finish_reason": finish}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [logprob(w, body) for w in text.split(" ")]}
            return web.json_response(
                {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [choice], "usage": usage}
            )  # fmt: skip
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)

        async def send(
            delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
        ) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if logprobs:
                choice["logprobs"] = {"content": [logprob(logprobs, body)]}
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [choice]}  # fmt: skip
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")

        if call is None:
            await send({"role": "assistant", "content": ""})
            for word in text.split(" "):
                await send({"content": word + " "}, logprobs=body.get("logprobs") and word)
            await send({}, "stop")
        else:
            first = {"index": 0, "id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": ""}}  # fmt: skip
            await send({"role": "assistant", "content": None, "tool_calls": [first]})
            for piece in ARGUMENT_PIECES:
                await send({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            await send({}, "tool_calls")
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                    "choices": [], "usage": usage}  # fmt: skip
            await response.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


def logprob(token: str, body: dict[str, Any]) -> dict[str, Any]:
    """A token's `logprobs.content` entry, with `top_logprobs` alternatives."""
    top = [
        {"token": f"{token}{i}", "logprob": -1.0 - i, "bytes": None}
        for i in range(body.get("top_logprobs") or 0)
    ]
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": top}
