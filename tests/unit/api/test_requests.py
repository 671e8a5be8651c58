"""Parsing OpenAI request bodies (what is accepted, the 400 that names the field), and
where the backends send them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.body import MAX_JSON_DEPTH, decode_json, tools_value
from gateway.api.errors import APIError
from gateway.api.openai.openai_requests import parse_chat, parse_completion, parse_embeddings
from gateway.inference.types import ChatMessage, RequestKind

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def refused(data: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_chat(data, default_max_tokens=32)
    assert caught.value.status == 400
    return caught.value


def test_chat_request_carries_every_sampling_field() -> None:
    request = parse_chat(
        chat(max_tokens=12, temperature=0.5, top_p=0.9, stop=["\n", "END"], seed=7, user="u1"),
        default_max_tokens=32,
    )
    assert request.kind is RequestKind.CHAT
    assert request.model == "m"
    assert request.messages == (ChatMessage("user", "hi"),)
    assert request.params.max_tokens == 12
    assert request.params.temperature == 0.5
    assert request.params.top_p == 0.9
    assert request.params.stop == ("\n", "END")
    assert request.params.seed == 7
    assert request.requested_max_tokens == 12
    assert request.user == "u1"
    assert request.stream is False


def test_model_default_applies_when_max_tokens_is_absent() -> None:
    request = parse_chat(chat(), default_max_tokens=32)
    assert request.params.max_tokens == 32
    assert request.requested_max_tokens is None


def test_max_completion_tokens_takes_precedence() -> None:
    request = parse_chat(chat(max_tokens=5, max_completion_tokens=9), default_max_tokens=32)
    assert request.params.max_tokens == 9


def test_text_parts_are_joined_and_a_stop_string_becomes_a_tuple() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse_chat(
        chat(messages=[{"role": "user", "content": content}], stop="x"), default_max_tokens=8
    )
    assert request.messages[0].content == "ab"
    assert request.params.stop == ("x",)


def test_stream_options_include_usage() -> None:
    request = parse_chat(
        chat(stream=True, stream_options={"include_usage": True}), default_max_tokens=8
    )
    assert request.stream and request.include_usage


TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "adds one",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": None}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"model": 3}, "model"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"description": "x"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [TOOL, {**TOOL, "function": {"name": "x y"}}]}, "tools[1].function.name"),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        (
            {"tools": [{**TOOL, "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{**TOOL, "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "c9", "content": "42"},
                ]
            },
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "assistant", "tool_calls": "f"}]}, "messages[0].tool_calls"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 2**64 - 1}, "seed"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"n": True}, "n"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": 5}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"$ref": "http://127.0.0.1:9/s"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"pattern": "(?=a)"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"$ref": "file:///etc/passwd"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"best_of": 2}, "best_of"),
        ({"best_of": True}, "best_of"),
        ({"suffix": "x"}, "suffix"),
        ({"echo": True}, "echo"),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": {"user": 1}, "content": "x"}]}, "messages[0].role"),
        ({"stop": ""}, "stop"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"presence_penalty": False}, "presence_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
def test_invalid_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    assert refused(chat(**fields)).param == param


def test_tools_and_their_history_are_parsed() -> None:
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    request = parse_chat(
        chat(
            messages=[
                {"role": "user", "content": "use f"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_1", "content": "2"},
            ],
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "f"}},
            parallel_tool_calls=False,
        ),
        default_max_tokens=8,
    )
    options = request.options
    assert options.tools[0].name == "f"
    assert options.tools[0].parameters == TOOL["function"]["parameters"]
    assert (options.tool_choice, options.forced_tool) == ("required", "f")
    assert options.parallel_tool_calls is False
    assert request.messages[1].tool_calls[0].arguments == '{"a": 1}'
    assert request.messages[1].content == ""
    assert request.messages[2].tool_call_id == "call_1"


def test_a_text_completion_refuses_chat_only_fields() -> None:
    body = {"model": "m", "prompt": "hi"}
    for field, value in (
        ("tools", [TOOL]),
        ("response_format", {"type": "json_object"}),
        ("tool_choice", "required"),
    ):
        with pytest.raises(APIError) as refused:
            parse_completion({**body, field: value}, default_max_tokens=8)
        assert refused.value.param == field
    assert parse_completion({**body, "tools": [], "tool_choice": "none"}, 8).prompt == "hi"


def test_response_format_is_parsed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = parse_chat(
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "A", "schema": schema, "strict": True},
            }
        ),
        default_max_tokens=8,
    ).options.response_format
    assert fmt is not None and (fmt.type, fmt.name, fmt.schema, fmt.strict) == (
        "json_schema",
        "A",
        schema,
        True,
    )
    assert parse_chat(chat(response_format={"type": "text"}), 8).options.response_format is None


def test_tool_choice_none_and_auto_need_no_tools() -> None:
    for choice in ("none", "auto"):
        assert (
            parse_chat(chat(tool_choice=choice), default_max_tokens=8).options.tool_choice == choice
        )


def test_seed_takes_the_whole_int64_range() -> None:
    for seed in (2**63 - 1, -(2**63), 0):
        assert parse_chat(chat(seed=seed), default_max_tokens=8).params.seed == seed


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1},
        {"logprobs": False},
        {"top_logprobs": 0},
        {"tools": []},
        {"functions": []},
        {"tool_choice": "none"},
        {"tool_choice": "auto"},
        {"function_call": "none"},
        {"response_format": {"type": "text"}},
        {"best_of": 1},
        {"suffix": ""},
        {"echo": False},
        {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}},
        {"tools": None, "logprobs": None, "response_format": None},
    ],
)
def test_fields_asking_for_the_default_behaviour_are_accepted(fields: dict[str, Any]) -> None:
    request = parse_chat(chat(**fields), default_max_tokens=8)
    assert request.messages == (ChatMessage("user", "hi"),)
    completion = parse_completion({"model": "m", "prompt": "p", **fields}, 8)
    assert completion.prompt == "p"


def test_completion_takes_a_string_or_a_list_of_prompts() -> None:
    assert parse_completion({"model": "m", "prompt": "p"}, 8).prompt == "p"
    assert parse_completion({"model": "m", "prompt": ["p"]}, 8).prompt == "p"
    several = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2}, 8)
    assert (several.prompt, several.prompts, several.n) == ("a", ("a", "b"), 2)


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([], "prompt"),
        ([1, 2, 3], "prompt"),  # token ids
        (["a", 5], "prompt[1]"),
        (["a"] * 65, "prompt"),
    ],
)
def test_bad_prompts_are_refused_by_name(prompt: object, param: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_completion({"model": "m", "prompt": prompt}, 8)
    assert caught.value.param == param


def test_more_choices_than_allowed_in_all_are_refused() -> None:
    with pytest.raises(APIError) as caught:
        parse_completion({"model": "m", "prompt": ["a"] * 8, "n": 9}, 8)
    assert caught.value.param == "prompt"


def test_completion_takes_echo_and_best_of_equal_to_n() -> None:
    request = parse_completion({"model": "m", "prompt": "p", "echo": True, "n": 2, "best_of": 2}, 8)
    assert (request.echo, request.n) == (True, 2)
    with pytest.raises(APIError) as caught:
        parse_completion({"model": "m", "prompt": "p", "n": 2, "best_of": 3}, 8)
    assert caught.value.param == "best_of"


def test_embeddings_take_a_text_or_a_list_of_texts() -> None:
    one = parse_embeddings({"model": "e", "input": "hi"}, 8)
    assert (one.inputs, one.base64, one.dimensions) == (("hi",), False, None)
    many = parse_embeddings(
        {"model": "e", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 64}, 8
    )
    assert (many.inputs, many.base64, many.dimensions) == (("a", "b"), True, 64)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": None}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": [1, 2]}, "input[0]"),  # token ids
        ({"input": [[1, 2]]}, "input[0]"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "user": 3}, "user"),
    ],
)
def test_bad_embedding_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_embeddings({"model": "e", **fields}, 8)
    assert caught.value.param == param


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"", b"\xff"])
def test_body_that_is_not_a_json_object_is_400(body: bytes) -> None:
    with pytest.raises(APIError) as caught:
        decode_json(body)
    assert caught.value.status == 400


@pytest.mark.parametrize("where", ["metadata", "tools", "messages"])
def test_a_body_nested_past_the_cap_is_400_at_any_depth(where: str) -> None:
    # At the cap it is accepted; past it (and past anything recursive code could take,
    # up to orjson's own limit of 1,024) it is a plain 400.
    # A top-level `tools` is checked when the tool cache parses it (`tools_value`).
    def decode(body: bytes) -> object:
        data = decode_json(body)
        return tools_value(data["tools"]) if where == "tools" else data

    inner = MAX_JSON_DEPTH - 2  # levels inside `{"where": [...]}`
    decode(b'{"%s": ' % where.encode() + b"[" * inner + b"]" * inner + b"}")
    for levels in (inner + 1, 1000):
        with pytest.raises(APIError, match="more than 128 levels") as caught:
            decode(b'{"%s": [' % where.encode() + b"[" * levels + b"]" * levels + b"]}")
        assert caught.value.status == 400


# Any JSON value, nested a little: what a careless or hostile client may send.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = st.sampled_from(
    ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
     "top_p", "stop", "seed", "stream", "stream_options", "user", "n", "tools", "tool_choice",
     "logprobs", "top_logprobs", "response_format", "presence_penalty", "logit_bias",
     "echo", "best_of", "input", "encoding_format", "dimensions"]
)  # fmt: skip
_MESSAGE = st.fixed_dictionaries(
    {}, optional={"role": _JSON | st.sampled_from(["user", "assistant"]), "content": _JSON}
)


@settings(max_examples=400, deadline=None)
@given(
    fields=st.dictionaries(_FIELDS, _JSON, max_size=6),
    messages=st.lists(_MESSAGE | _JSON, max_size=3),
)
def test_any_body_is_parsed_or_refused_with_a_400(
    fields: dict[str, Any], messages: list[Any]
) -> None:
    """No JSON object reaches anything but an InferenceRequest or a 400 naming a field."""
    for parse, body in (
        (parse_chat, {"model": "m", "messages": messages, **fields}),
        (parse_completion, {"model": "m", "prompt": "p", **fields}),
        (parse_embeddings, {"model": "m", "input": "i", **fields}),
    ):
        try:
            parse(body, 8)
        except APIError as error:
            assert error.status == 400
