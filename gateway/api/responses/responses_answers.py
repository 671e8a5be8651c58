"""OpenAI Responses API answers: the `response` object and its stream of events
(`response.created` ... `response.completed`, each with its `sequence_number`), written
from the gateway's internal results.

A call of a custom tool (offered to the model as a function of one `input` argument,
`responses_requests`) is answered as a `custom_tool_call` item holding that text. Its
stream has no argument deltas: the text is known once the call's JSON is whole, and
`response.custom_tool_call_input.delta` carries it then, before `.done`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.api.errors import APIError
from gateway.api.responses.responses_requests import (
    CUSTOM_INPUT,
    NAMESPACE_SEPARATOR,
    ResponsesState,
)
from gateway.inference.ids import random_id
from gateway.inference.types import (
    ChatMessage,
    Completion,
    InferenceRequest,
    ToolCall,
    ToolCallDelta,
    Usage,
)


def state_of(request: InferenceRequest) -> ResponsesState:
    state = request.wire_state
    return state if isinstance(state, ResponsesState) else ResponsesState()


def response_object(
    request: InferenceRequest,
    response_id: str,
    model: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
) -> dict[str, Any]:
    """The `response` object: what was asked (as sent), what came out, its status."""
    state = state_of(request)
    params = request.params
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": state.instructions,
        "max_output_tokens": state.max_output_tokens,
        "metadata": dict(state.metadata),
        "model": model,
        "output": output,
        "parallel_tool_calls": state.parallel_tool_calls,
        "previous_response_id": state.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": state.store,
        "temperature": params.temperature,
        "text": {"format": dict(state.text_format)},
        "tool_choice": state.tool_choice,
        # As sent: the client's JSON text, or the request's dicts (not copied).
        "tools": state.tools if isinstance(state.tools, orjson.Fragment) else list(state.tools),
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": None if usage is None else _usage(usage),
        "user": request.user,
    }


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [] if status == "in_progress" else [_text_part(text)],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: ToolCall, status: str, state: ResponsesState) -> dict[str, Any]:
    """A `function_call` item, or a `custom_tool_call` one for a custom tool; a
    namespace's tool named as the client named it, `name` and `namespace` apart, not as
    the model knows it (`ns__name`)."""
    item: dict[str, Any]
    if call.name in state.custom:
        item = {
            "id": item_id,
            "type": "custom_tool_call",
            "call_id": call.id,
            "name": call.name,
            "input": "" if status == "in_progress" else custom_input(call.arguments),
        }
    else:
        item = {
            "id": item_id,
            "type": "function_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }
    namespaced = state.namespaced.get(call.name)
    if namespaced is not None:
        item["namespace"], item["name"] = namespaced
    return item


def custom_input(arguments: str) -> str:
    """A custom tool's text from the arguments the model wrote: their `input`, or, when
    the model wrote something else (a call cut short, another shape), all of it as it is."""
    try:
        written = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    text = written.get(CUSTOM_INPUT) if isinstance(written, dict) else None
    return text if isinstance(text, str) and len(written) == 1 else arguments


def response_body(
    parts: Sequence[InferenceRequest],
    completions: Sequence[Completion],
    *,
    response_id: str,
    model: str,
) -> bytes:
    """The `response` object of a whole answer."""
    completion = completions[0]
    state = state_of(parts[0])
    output = []
    if completion.text or not completion.tool_calls:
        output.append(_message_item("msg_" + random_id(), completion.text, "completed"))
    for call in completion.tool_calls:
        output.append(_call_item("fc_" + random_id(), call, "completed", state))
    if completion.finish_reason == "length" and "status" in output[-1]:
        output[-1]["status"] = "incomplete"  # the item the token limit cut
    response = response_object(
        parts[0],
        response_id,
        model,
        int(time.time()),
        _status(completion.finish_reason),
        output,
        completion.usage,
    )
    return orjson.dumps(response)


def conversation_after(request: InferenceRequest, response: dict[str, Any]) -> list[ChatMessage]:
    """The conversation a stored response continues: its request's, then its output."""
    text = "".join(
        part.get("text", "")
        for item in response["output"]
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
    calls = tuple(
        ToolCall(item["call_id"], _model_name(item), _arguments(item))
        for item in response["output"]
        if item.get("type") in ("function_call", "custom_tool_call")
    )
    return [*state_of(request).conversation, ChatMessage("assistant", text, calls)]


def _arguments(item: dict[str, Any]) -> str:
    """A call's arguments as the model wrote them (a custom call's text as `input`)."""
    if item["type"] == "custom_tool_call":
        return orjson.dumps({CUSTOM_INPUT: item["input"]}).decode()
    arguments: str = item["arguments"]
    return arguments


def _model_name(item: dict[str, Any]) -> str:
    """The name the model knows a call's function by (`ns__name` in a namespace)."""
    namespace = item.get("namespace")
    name: str = item["name"]
    return name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


class ResponseStreamWriter:
    """The Responses API's events for one streamed answer. It keeps the whole answer as
    it goes: `response.completed` carries it, and a stored response is made of it."""

    def __init__(
        self, request: InferenceRequest, response_id: str, model: str, prompt_estimate: int
    ) -> None:
        self._request, self._id, self._model = request, response_id, model
        self._state = state_of(request)
        self._created = int(time.time())
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        # The open item: its id and text (a message) or call (a function call).
        self._item_id = ""
        self._text: list[str] | None = None
        self._call: list[str] | None = None  # call id, name, arguments so far
        self.final: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _snapshot(self, status: str, usage: Usage | None = None) -> dict[str, Any]:
        return response_object(
            self._request, self._id, self._model, self._created, status, self._output, usage
        )

    def start(self) -> bytes:
        created = self._event("response.created", response=self._snapshot("in_progress"))
        return created + self._event("response.in_progress", response=self._snapshot("in_progress"))

    @property
    def _index(self) -> int:
        return len(self._output)

    def text(self, text: str, logprobs: list[Any] | None = None, index: int = 0) -> bytes:
        events = b""
        if self._text is None:
            events = self._close_item()
            self._item_id, self._text = "msg_" + random_id(), []
            item = _message_item(self._item_id, "", "in_progress")
            events += self._event("response.output_item.added", output_index=self._index, item=item)
            events += self._event(
                "response.content_part.added",
                item_id=self._item_id,
                output_index=self._index,
                content_index=0,
                part=_text_part(""),
            )
        self._text.append(text)
        return events + self._event(
            "response.output_text.delta",
            item_id=self._item_id,
            output_index=self._index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def tool_calls(self, fragments: tuple[ToolCallDelta, ...], index: int = 0) -> bytes:
        events = b""
        for fragment in fragments:
            if fragment.id is not None:
                events += self._close_item()
                self._item_id = "fc_" + random_id()
                self._call = [fragment.id, fragment.name or "", ""]
                call = ToolCall(fragment.id, fragment.name or "", "")
                item = _call_item(self._item_id, call, "in_progress", self._state)
                events += self._event(
                    "response.output_item.added", output_index=self._index, item=item
                )
            if fragment.arguments and self._call is not None:
                self._call[2] += fragment.arguments
                if self._call[1] in self._state.custom:
                    continue  # its text is known once its JSON is whole (`_close_item`)
                events += self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._item_id,
                    output_index=self._index,
                    delta=fragment.arguments,
                )
        return events

    def _close_item(self, status: str = "completed") -> bytes:
        """The `.done` events of the open item, which joins the output (`incomplete`:
        the token limit cut it)."""
        index = self._index
        if self._text is not None:
            text = "".join(self._text)
            self._text = None
            item = _message_item(self._item_id, text, status)
            self._output.append(item)
            return (
                self._event(
                    "response.output_text.done",
                    item_id=self._item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                + self._event(
                    "response.content_part.done",
                    item_id=self._item_id,
                    output_index=index,
                    content_index=0,
                    part=_text_part(text),
                )
                + self._event("response.output_item.done", output_index=index, item=item)
            )
        if self._call is not None:
            call_id, name, arguments = self._call
            self._call = None
            call = ToolCall(call_id, name, arguments)
            item = _call_item(self._item_id, call, status, self._state)
            self._output.append(item)
            if item["type"] == "custom_tool_call":
                fields = {"item_id": self._item_id, "output_index": index}
                return (
                    self._event(
                        "response.custom_tool_call_input.delta", **fields, delta=item["input"]
                    )
                    + self._event(
                        "response.custom_tool_call_input.done", **fields, input=item["input"]
                    )
                    + self._event("response.output_item.done", output_index=index, item=item)
                )
            return self._event(
                "response.function_call_arguments.done",
                item_id=self._item_id,
                output_index=index,
                name=item["name"],
                arguments=arguments,
            ) + self._event("response.output_item.done", output_index=index, item=item)
        return b""

    def close(self, finish_reason: str, usage: Usage) -> bytes:
        status = _status(finish_reason)
        events = self._close_item("incomplete" if status == "incomplete" else "completed")
        self.final = self._snapshot(status, usage)
        return events + self._event(f"response.{status}", response=self.final)

    def answer(self) -> dict[str, Any] | None:
        """The response object `response.completed` carried, once closed."""
        return self.final

    def error(self, error: APIError) -> bytes:
        failed = self._snapshot("failed")
        failed["error"] = {"code": error.code or error.type, "message": error.message}
        return self._event(
            "error", code=error.code or error.type, message=error.message, param=error.param
        ) + self._event("response.failed", response=failed)
