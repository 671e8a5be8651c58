"""Tool calling through an OpenAI-compatible upstream, with the official SDK as the
client: calls streamed and not, an agent loop, bad tools refused by name, a model
without the capability refused, and arguments sanitized for an external model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant
from tests.e2e.tool_upstream import ToolModel
from tests.e2e.upstreams import serve_in_thread

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
TIME: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_model() -> Iterator[tuple[ToolModel, list[str]]]:
    upstream = ToolModel()
    with serve_in_thread([upstream.app()]) as urls:
        yield upstream, urls


@pytest.fixture(scope="module")
def gateway(
    tool_model: tuple[ToolModel, list[str]],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    _, urls = tool_model
    tools = {"capabilities": {"tools": True, "logprobs": True}}
    models = {
        "agent": model("openai", urls, **tools),
        "hosted": model("openai", urls, external=True, **tools),
        "plain": model("openai", urls),
    }
    with running_gateway(
        tmp_path_factory.mktemp("tools"), models, redis_url, tenants={"acme": tenant("acme", ["*"])}
    ) as gw:
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


def test_a_tool_call_comes_back_as_the_sdk_types_it(client: OpenAI) -> None:
    reply = client.chat.completions.create(model="agent", messages=ASK, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    assert call.id.startswith("call_")


def test_streamed_tool_call_fragments_are_relayed_in_order(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="agent", messages=ASK, tools=[WEATHER], stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert fragments[0].id and fragments[0].function and fragments[0].function.name == "get_weather"
    assert [f.index for f in fragments] == [0] * len(fragments)
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    assert json.loads(arguments) == {"city": "Paris", "unit": "C"}
    assert len(fragments) >= 3  # pieces as they came, not one call held to the end
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 27


def test_an_agent_loop_call_result_answer(
    client: OpenAI, tool_model: tuple[ToolModel, list[str]]
) -> None:
    upstream, _ = tool_model
    messages: list[Any] = list(ASK)
    reply = client.chat.completions.create(model="agent", messages=messages, tools=[WEATHER, TIME])
    call = (reply.choices[0].message.tool_calls or [])[0]
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"})
    final = client.chat.completions.create(model="agent", messages=messages, tools=[WEATHER, TIME])
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "The tool said: 18 C and sunny"
    # The history went upstream as the client sent it.
    sent = upstream.bodies[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[2] == {"role": "tool", "content": "18 C and sunny", "tool_call_id": call.id}


def test_tool_choice_and_parallel_tool_calls_pass_through(
    client: OpenAI, tool_model: tuple[ToolModel, list[str]]
) -> None:
    upstream, _ = tool_model
    reply = client.chat.completions.create(
        model="agent", messages=ASK, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
    )  # fmt: skip
    assert (reply.choices[0].message.tool_calls or [])[0].function.name == "get_time"
    body = upstream.bodies[-1]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert body["parallel_tool_calls"] is False
    assert body["tools"] == [WEATHER, TIME]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"description": "x"}}]},
         "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
         "messages[1].tool_call_id"),
    ],
)  # fmt: skip
def test_bad_tools_are_refused_by_name(client: OpenAI, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**{"model": "agent", "messages": ASK, **fields})
    assert refused.value.param == param


def test_a_model_without_tools_refuses_them(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="plain", messages=ASK, tools=[WEATHER])
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.body["message"] == "The model `plain` does not support `tools`."  # type: ignore[index]


def test_tool_arguments_and_results_are_masked_for_an_external_model(
    client: OpenAI, tool_model: tuple[ToolModel, list[str]]
) -> None:
    upstream, _ = tool_model
    secret = "sk-proj-Zx81Qw0aLm2Pq9"
    arguments = json.dumps({"key": secret})
    calls = [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
    ]
    client.chat.completions.create(
        model="hosted",
        messages=[*ASK, {"role": "assistant", "content": None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": "call_9", "content": f"used {secret}"}],
        tools=[WEATHER],
    )  # fmt: skip
    sent = upstream.bodies[-1]["messages"]
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"key": "[API_KEY_1]"}
    assert sent[1]["tool_calls"][0]["id"] == "call_9"  # ids are not masked: they pair results
    assert sent[2]["content"] == "used [API_KEY_1]"


def test_logprobs_come_back_where_the_upstream_gives_them(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="agent", messages=ASK, logprobs=True, top_logprobs=2
    )
    content = (reply.choices[0].logprobs and reply.choices[0].logprobs.content) or []
    assert [t.token for t in content] == ["No", "tool", "needed."]
    assert [len(t.top_logprobs) for t in content] == [2, 2, 2]
    chunks = list(
        client.chat.completions.create(model="agent", messages=ASK, logprobs=True, stream=True)
    )
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or []]  # fmt: skip
    assert streamed == ["No", "tool", "needed."]


def test_a_model_without_logprobs_is_refused_by_name(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="plain", messages=ASK, logprobs=True)
    assert refused.value.param == "logprobs"
    assert "`plain` does not support `logprobs`" in refused.value.message


# --- a Triton model that writes Hermes tool calls (the simulator) --------------------------

HERMES = {"capabilities": {"tools": True, "tool_parser": "hermes"}, "max_tokens_default": 64}


@pytest.fixture(scope="module")
def triton_gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    models = {
        "hermes-http": model("triton_http", [a.http_url], upstream_model="llm-small", **HERMES),
        "hermes-grpc": model("triton_grpc", [a.grpc_target], upstream_model="llm-small", **HERMES),
    }
    with running_gateway(
        tmp_path_factory.mktemp("triton-tools"), models, redis_url,
        tenants={"acme": tenant("acme", ["*"])},
    ) as gw:  # fmt: skip
        yield gw


@pytest.fixture
def triton(triton_gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=triton_gateway.base_url, api_key="sk-test-acme", max_retries=0)


@pytest.mark.parametrize("name", ["hermes-http", "hermes-grpc"])
def test_a_triton_model_calls_a_tool_with_arguments_valid_for_its_schema(
    triton: OpenAI, name: str
) -> None:
    reply = triton.chat.completions.create(model=name, messages=ASK, tools=[WEATHER, TIME])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert not choice.message.content  # the <tool_call> block is not left in the text


@pytest.mark.parametrize("name", ["hermes-http", "hermes-grpc"])
def test_a_triton_models_call_streams_as_it_is_written(triton: OpenAI, name: str) -> None:
    chunks = list(
        triton.chat.completions.create(model=name, messages=ASK, tools=[WEATHER], stream=True)
    )
    fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert fragments[0].function and fragments[0].function.name == "get_weather"
    assert fragments[0].id and fragments[0].id.startswith("call_")
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert len([f for f in fragments if f.function and f.function.arguments]) > 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize("name", ["hermes-http", "hermes-grpc"])
def test_a_tool_call_cut_by_the_token_limit_ends_as_cut(triton: OpenAI, name: str) -> None:
    # It was reported as finished (`tool_calls`, arguments not JSON) streamed, and as
    # `length` with the raw `<tool_call>` text as its content whole.
    reply = triton.chat.completions.create(model=name, messages=ASK, tools=[WEATHER], max_tokens=6)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert "<tool_call>" not in (choice.message.content or "")
    chunks = list(
        triton.chat.completions.create(
            model=name, messages=ASK, tools=[WEATHER], stream=True, max_tokens=6
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text
    fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    arguments = "".join((f.function.arguments or "") for f in fragments if f.function)
    assert not arguments.startswith(" ")


def test_a_triton_agent_loop_and_a_forced_tool(triton: OpenAI) -> None:
    messages: list[Any] = list(ASK)
    reply = triton.chat.completions.create(
        model="hermes-http", messages=messages, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    call = (reply.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "get_time"
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "12:00 UTC"})
    final = triton.chat.completions.create(model="hermes-http", messages=messages, tools=[TIME])
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    # tool_choice "none": the tools are not offered, the model answers in text.
    plain = triton.chat.completions.create(
        model="hermes-http", messages=ASK, tools=[WEATHER], tool_choice="none"
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
