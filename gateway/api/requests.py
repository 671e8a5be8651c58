"""Parse OpenAI request bodies into `InferenceRequest`, naming the field at fault."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.api.errors import APIError, bad_request
from gateway.inference.types import (
    ChatMessage,
    InferenceRequest,
    RequestKind,
    SamplingParams,
)

# What the parser accepts; `api/openapi.py` documents the same values.
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_STOP = 4
INT64 = (-(2**63), 2**63 - 1)


def _is_int(value: object, wanted: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == wanted


def _is_number(value: object, wanted: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == wanted


# Fields OpenAI defines for behaviour this gateway does not implement. A value that asks
# for the default behaviour is accepted (SDKs and frameworks send them); any other value
# is refused loudly rather than silently answered with something else than asked.
# name -> (is the default, what is accepted)
DEFAULT_ONLY: dict[str, tuple[Callable[[object], bool], str]] = {
    "tools": (lambda v: v == [], "an empty list"),
    "functions": (lambda v: v == [], "an empty list"),
    "tool_choice": (lambda v: v in ("none", "auto"), '"none" or "auto" (there are no tools)'),
    "function_call": (lambda v: v in ("none", "auto"), '"none" or "auto"'),
    "logprobs": (lambda v: v is False, "false"),
    "top_logprobs": (lambda v: _is_int(v, 0), "0"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"}'),
    "best_of": (lambda v: _is_int(v, 1), "1"),
    "suffix": (lambda v: v == "", "an empty string"),
    "echo": (lambda v: v is False, "false"),
    # Sampling settings no backend here applies (yet): refused rather than dropped.
    "presence_penalty": (lambda v: _is_number(v, 0), "0"),
    "frequency_penalty": (lambda v: _is_number(v, 0), "0"),
    "logit_bias": (lambda v: v == {}, "an empty object"),
}


def decode_json(body: bytes) -> Mapping[str, Any]:
    """The JSON object in a request body, or a 400."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    return data


def parse_chat(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/chat/completions` body."""
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("`messages` must be a non-empty array.", "messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw_messages))
    return _request(data, RequestKind.CHAT, default_max_tokens, messages=messages)


def parse_completion(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/completions` body."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_request(
            "`prompt` must be a string (batched prompts are not supported).", "prompt"
        )
    return _request(data, RequestKind.COMPLETION, default_max_tokens, prompt=prompt)


def requested_model(data: Mapping[str, Any]) -> str:
    """The `model` field, which routing needs before the rest is parsed."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required and must be a string.", "model")
    return model


def _request(
    data: Mapping[str, Any],
    kind: RequestKind,
    default_max_tokens: int,
    *,
    messages: tuple[ChatMessage, ...] = (),
    prompt: str = "",
) -> InferenceRequest:
    for name, (is_default, accepted) in DEFAULT_ONLY.items():
        value = data.get(name)
        if value is not None and not is_default(value):
            raise bad_request(
                f"`{name}` is not supported by this gateway: only {accepted} is accepted.", name
            )
    n = _optional_int(data, "n", minimum=1)
    if n not in (None, 1):
        raise bad_request("Only `n` = 1 is supported.", "n")
    max_tokens = _optional_int(data, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _optional_int(data, "max_tokens", minimum=1)
    stream = _optional_bool(data, "stream") or False
    include_usage = False
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request("`stream_options` must be an object.", "stream_options")
        if not stream:
            raise bad_request(
                "`stream_options` is only allowed when `stream` is true.", "stream_options"
            )
        include_usage = (
            _optional_bool(options, "include_usage", "stream_options.include_usage") or False
        )
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("`user` must be a string.", "user")
    params = SamplingParams(
        max_tokens=max_tokens or default_max_tokens,
        temperature=_optional_float(data, "temperature", 0.0, 2.0),
        top_p=_optional_float(data, "top_p", 0.0, 1.0),
        stop=_stop(data.get("stop")),
        seed=_optional_int(data, "seed", *INT64),
    )
    return InferenceRequest(
        kind=kind,
        model=requested_model(data),
        params=params,
        stream=stream,
        include_usage=include_usage,
        messages=messages,
        prompt=prompt,
        requested_max_tokens=max_tokens,
        user=user,
    )


def _message(raw: object, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise bad_request(f"`{where}` must be an object.", where)
    role = raw.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise bad_request(
            f"`{where}.role` must be one of {', '.join(sorted(ROLES))}.", f"{where}.role"
        )
    content = raw.get("content")
    if isinstance(content, list):
        # The multi-part form: only text parts can reach a text model.
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(
                    f"`{where}.content` may only hold text parts.", f"{where}.content"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"`{where}.content[].text` must be a string.", f"{where}.content")
            parts.append(text)
        content = "".join(parts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise bad_request(f"`{where}.content` must be a string.", f"{where}.content")
    return ChatMessage(role=role, content=content)


def _stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (
        isinstance(stops, list)
        and len(stops) <= MAX_STOP
        and all(isinstance(s, str) and s for s in stops)
    ):
        return tuple(stops)
    raise bad_request(
        f"`stop` must be a non-empty string or up to {MAX_STOP} non-empty strings.", "stop"
    )


def _optional_int(
    data: Mapping[str, Any], name: str, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    # bool is an int in Python; a JSON `true` is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"`{name}` must be an integer.", name)
    if maximum is not None and minimum is not None and not minimum <= value <= maximum:
        raise bad_request(f"`{name}` must be between {minimum} and {maximum}.", name)
    if minimum is not None and value < minimum:
        raise bad_request(f"`{name}` must be at least {minimum}.", name)
    return value


def _optional_float(data: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise bad_request(f"`{name}` must be a number.", name)
    if not low <= value <= high:
        raise bad_request(f"`{name}` must be between {low:g} and {high:g}.", name)
    return float(value)


def _optional_bool(data: Mapping[str, Any], name: str, param: str | None = None) -> bool | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"`{param or name}` must be a boolean.", param or name)
    return value


__all__ = ["APIError", "decode_json", "parse_chat", "parse_completion", "requested_model"]
