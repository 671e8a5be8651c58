"""OpenAI's chat, completion and embedding request bodies parsed into `InferenceRequest`,
naming the field at fault."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gateway.api.body import (
    MAX_STOP,
    check_tool_results,
    optional_bool,
    optional_float,
    optional_int,
    parse_response_format,
    parse_tools,
    requested_model,
    tools_value,
)
from gateway.api.errors import bad_request
from gateway.api.tool_lists import ToolListCache
from gateway.inference.types import (
    NO_OPTIONS,
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    Tool,
    ToolCall,
)

# What the parser accepts; `api/openapi.py` documents the same values.
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
INT64 = (-(2**63), 2**63 - 1)


def _is_number(value: object, wanted: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == wanted


# Fields OpenAI defines for behaviour this gateway does not implement. A value that asks
# for the default behaviour is accepted (SDKs and frameworks send them); any other value
# is refused loudly rather than silently answered with something else than asked.
# name -> (is the default, what is accepted)
DEFAULT_ONLY: dict[str, tuple[Callable[[object], bool], str]] = {
    # The deprecated forms of `tools` and `tool_choice`.
    "functions": (lambda v: v == [], "an empty list (use `tools`)"),
    "function_call": (lambda v: v in ("none", "auto"), '"none" or "auto" (use `tool_choice`)'),
    # Text after the completion needs a fill-in-the-middle model; none is served here.
    "suffix": (lambda v: v == "", "an empty string"),
    # Sampling settings no backend here applies (yet): refused rather than dropped.
    "presence_penalty": (lambda v: _is_number(v, 0), "0"),
    "frequency_penalty": (lambda v: _is_number(v, 0), "0"),
    "logit_bias": (lambda v: v == {}, "an empty object"),
}


# Chat fields that a text completion does not take (other than at their default).
CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "top_logprobs")
# Text completion fields that chat does not take (other than at their default).
COMPLETION_ONLY = {"echo": False, "best_of": 1}
# Choices a request may ask for (`n`), and upstream requests it may make in all (`n`
# times the prompts of a text completion): each is admitted and charged on its own.
MAX_N = 16
MAX_CHOICES = 64


def parse_chat(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/chat/completions` body."""
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("`messages` must be a non-empty array.", "messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw_messages))
    check_tool_results(messages)
    for name, default in COMPLETION_ONLY.items():
        value = data.get(name)
        # `type` too: JSON's `true` is not 1.
        if value is not None and (type(value) is not type(default) or value != default):
            raise bad_request(f"`{name}` is a field of `/v1/completions` only.", name)

    def options() -> ChatOptions:
        tools = _TOOLS.parse(data.get("tools"))
        choice, forced = _tool_choice(data.get("tool_choice"), tools)
        parallel = optional_bool(data, "parallel_tool_calls")
        if not tools and parallel is not None:
            parallel = None  # meaningless without tools; SDKs send it anyway
        return ChatOptions(
            tools=tools,
            tool_choice=choice,
            forced_tool=forced,
            parallel_tool_calls=parallel,
            response_format=parse_response_format(data.get("response_format")),
            top_logprobs=_logprobs(data),
        )

    # The options read after the common fields (as their errors come), in the one
    # request made: `dataclasses.replace` cost more than the rest of the parse.
    return _request(
        data, RequestKind.CHAT, default_max_tokens, messages=messages, chat_options=options
    )


def parse_completion(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/completions` body."""
    prompts = _prompts(data.get("prompt"))
    for name in CHAT_ONLY:
        if data.get(name) not in (None, [], {"type": "text"}, "none", "auto", 0):
            raise bad_request(f"`{name}` is a field of `/v1/chat/completions` only.", name)
    if data.get("logprobs") not in (None, False, 0):
        raise bad_request(
            "`logprobs` is not supported on `/v1/completions` (it is on chat completions).",
            "logprobs",
        )
    request = _request(data, RequestKind.COMPLETION, default_max_tokens, prompt=prompts[0])
    if len(prompts) * request.n > MAX_CHOICES:
        raise bad_request(
            f"`n` times the number of prompts may be at most {MAX_CHOICES}.", "prompt"
        )
    best_of = optional_int(data, "best_of", minimum=1)
    if best_of is not None and best_of != request.n:
        raise bad_request(
            "`best_of` may only equal `n`: ranking more choices than are returned needs "
            "their log probabilities, which the gateway does not compare.",
            "best_of",
        )
    return dataclasses.replace(
        request,
        prompts=prompts if len(prompts) > 1 else (),
        echo=optional_bool(data, "echo") or False,
    )


def _prompts(raw: object) -> tuple[str, ...]:
    """`prompt`: a string, or an array of strings (one completion each)."""
    prompts = [raw] if isinstance(raw, str) else raw
    if not isinstance(prompts, list) or not prompts:
        raise bad_request("`prompt` must be a string or a non-empty array of strings.", "prompt")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        raise bad_request("`prompt` must be text: token ids are not supported.", "prompt")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            where = "prompt" if isinstance(raw, str) else f"prompt[{index}]"
            raise bad_request(f"`{where}` must be a string.", where)
    if len(prompts) > MAX_CHOICES:
        raise bad_request(f"`prompt` may hold at most {MAX_CHOICES} prompts.", "prompt")
    return tuple(prompts)


def parse_embeddings(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/embeddings` body: `input` (a text or a list of texts), `encoding_format`,
    `dimensions`, `user`. Texts as token ids are refused: the gateway cannot read them."""
    tools_value(data.get("tools"))  # not used here, but JSON like the rest of the body
    raw = data.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts:
        raise bad_request("`input` must be a non-empty string or array of strings.", "input")
    for index, text in enumerate(texts):
        where = "input" if isinstance(raw, str) else f"input[{index}]"
        if isinstance(text, int | list):
            raise bad_request(
                f"`{where}` is given as token ids; this gateway takes text only "
                "(langchain's OpenAIEmbeddings: `check_embedding_ctx_length=False`).",
                where,
            )
        if not isinstance(text, str) or not text:
            raise bad_request(f"`{where}` must be a non-empty string.", where)
    encoding = data.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request('`encoding_format` must be "float" or "base64".', "encoding_format")
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("`user` must be a string.", "user")
    return InferenceRequest(
        kind=RequestKind.EMBEDDING,
        model=requested_model(data),
        params=SamplingParams(max_tokens=0),
        inputs=tuple(texts),
        dimensions=optional_int(data, "dimensions", minimum=1),
        base64=encoding == "base64",
        user=user,
    )


def _request(
    data: Mapping[str, Any],
    kind: RequestKind,
    default_max_tokens: int,
    *,
    messages: tuple[ChatMessage, ...] = (),
    prompt: str = "",
    chat_options: Callable[[], ChatOptions] | None = None,
) -> InferenceRequest:
    for name, (is_default, accepted) in DEFAULT_ONLY.items():
        value = data.get(name)
        if value is not None and not is_default(value):
            raise bad_request(
                f"`{name}` is not supported by this gateway: only {accepted} is accepted.", name
            )
    n = optional_int(data, "n", 1, MAX_N) or 1
    max_tokens = optional_int(data, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = optional_int(data, "max_tokens", minimum=1)
    stream = optional_bool(data, "stream") or False
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
            optional_bool(options, "include_usage", "stream_options.include_usage") or False
        )
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("`user` must be a string.", "user")
    params = SamplingParams(
        max_tokens=max_tokens or default_max_tokens,
        temperature=optional_float(data, "temperature", 0.0, 2.0),
        top_p=optional_float(data, "top_p", 0.0, 1.0),
        stop=_stop(data.get("stop")),
        seed=optional_int(data, "seed", *INT64),
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
        n=n,
        options=NO_OPTIONS if chat_options is None else chat_options(),
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
    tool_calls = _tool_calls(raw.get("tool_calls"), where) if role == "assistant" else ()
    tool_call_id = None
    if role == "tool":
        tool_call_id = raw.get("tool_call_id")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise bad_request(
                f"`{where}.tool_call_id` is required on a `tool` message: the id of the call "
                "it answers.",
                f"{where}.tool_call_id",
            )
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
        content = ""  # an assistant turn of tool calls only
    if not isinstance(content, str):
        raise bad_request(f"`{where}.content` must be a string.", f"{where}.content")
    return ChatMessage(role, content, tool_calls=tool_calls, tool_call_id=tool_call_id)


# Kept by the list's JSON: an agent sends the same tools every turn (`tool_lists`).
_TOOLS = ToolListCache(lambda raw: parse_tools(tools_value(raw)))


MAX_TOP_LOGPROBS = 20


def _logprobs(data: Mapping[str, Any]) -> int | None:
    """`top_logprobs` when `logprobs` is true (0: the chosen tokens only), else None."""
    wanted = optional_bool(data, "logprobs")
    top = optional_int(data, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top not in (None, 0) and not wanted:
        raise bad_request("`top_logprobs` needs `logprobs` to be true.", "top_logprobs")
    return (top or 0) if wanted else None


def _tool_choice(raw: object, tools: tuple[Tool, ...]) -> tuple[str | None, str | None]:
    """(mode, forced function name) of `tool_choice`."""
    if raw is None:
        return None, None
    if raw == "none" or raw == "auto":
        return raw, None
    if raw == "required" or isinstance(raw, dict):
        if not tools:
            raise bad_request(
                "`tool_choice` asks for a tool call, but `tools` is empty.", "tool_choice"
            )
        if not isinstance(raw, dict):
            return "required", None
        function = raw.get("function") if raw.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise bad_request(
                '`tool_choice` must be "none", "auto", "required" or '
                '{"type": "function", "function": {"name": ...}}.',
                "tool_choice",
            )
        if name not in {tool.name for tool in tools}:
            raise bad_request(
                f"`tool_choice.function.name`: `{name}` is not one of `tools`.",
                "tool_choice.function.name",
            )
        return "required", name
    raise bad_request(
        '`tool_choice` must be "none", "auto", "required" or a function.', "tool_choice"
    )


def _tool_calls(raw: object, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`, as the client sends its history back."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request(f"`{where}.tool_calls` must be an array.", f"{where}.tool_calls")
    calls = []
    for index, entry in enumerate(raw):
        at = f"{where}.tool_calls[{index}]"
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(function, dict):
            raise bad_request(f"`{at}` must be a function call object.", at)
        call_id, name, arguments = entry.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"`{at}.id` must be a non-empty string.", f"{at}.id")
        if not isinstance(name, str) or not name:
            raise bad_request(
                f"`{at}.function.name` must be a non-empty string.", f"{at}.function.name"
            )
        if not isinstance(arguments, str):
            raise bad_request(
                f"`{at}.function.arguments` must be a string (JSON text).",
                f"{at}.function.arguments",
            )
        calls.append(ToolCall(call_id, name, arguments))
    return tuple(calls)


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
