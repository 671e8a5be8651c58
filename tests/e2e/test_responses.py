"""`POST /v1/responses` with the official `openai` SDK (`client.responses`) and the OpenAI
Agents SDK as clients, against a Triton model (the simulator, with Hermes tool calls):
text and function calls, created and streamed (the SDK's typed parsers are the
conformance check), a namespace's function called and a hosted tool left out (Codex
CLI's tools), a conversation continued by `previous_response_id`, stored
responses read and deleted, another tenant's id not found, bad input refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from agents import (
    Agent,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models import get_default_model
from openai import AsyncOpenAI, OpenAI

from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from gateway_tools.dev.sim.model_template import generate_pieces
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant

HERMES = {"capabilities": {"tools": True, "tool_parser": "hermes", "structured_outputs": True}}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    },
}
ASK = "What is the weather in Paris?"
# The names the clients send by default: the Agents SDK's default model.
DEFAULT_NAMES = [get_default_model()]


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    models = {
        "local": model(
            "triton_http", [a.http_url], upstream_model="llm-small",
            aliases=DEFAULT_NAMES, max_tokens_default=256, **HERMES,
        ),
    }  # fmt: skip
    tenants = {"acme": tenant("acme", ["*"]), "globex": tenant("globex", ["*"])}
    with running_gateway(
        tmp_path_factory.mktemp("responses"), models, redis_url, tenants=tenants
    ) as gw:
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


def expected_text(messages: list[ChatMessage], max_tokens: int) -> str:
    prompt = PromptTemplate("chatml").render(messages)
    return "".join(generate_pieces(prompt.encode(), max_tokens))


def test_a_text_answer_is_a_response(client: OpenAI) -> None:
    reply = client.responses.create(
        model="local", input="Hi", instructions="Be brief.", max_output_tokens=8,
        metadata={"ticket": "42"},
    )  # fmt: skip
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert reply.output_text == expected_text(messages, 8)
    assert reply.usage is not None and reply.usage.output_tokens == 8
    assert reply.metadata == {"ticket": "42"} and reply.instructions == "Be brief."


def test_a_function_call_and_its_output_continue_by_previous_response_id(
    client: OpenAI,
) -> None:
    first = client.responses.create(model="local", input=ASK, tools=[WEATHER])
    assert first.status == "completed"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    second = client.responses.create(
        model="local",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[WEATHER],
        max_output_tokens=16,
    )
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"]
    # The model saw the whole conversation: the question, its call, the call's output.
    history = [
        ChatMessage("user", ASK),
        ChatMessage("assistant", "", first_calls(first)),
        ChatMessage("tool", "18 C", tool_call_id=call.call_id),
    ]
    assert second.output_text == expected_text_with_tools(history, 16)


def first_calls(response: Any) -> tuple[Any, ...]:
    from gateway.inference.types import ToolCall

    return tuple(
        ToolCall(item.call_id, item.name, item.arguments)
        for item in response.output
        if item.type == "function_call"
    )


def expected_text_with_tools(messages: list[ChatMessage], max_tokens: int) -> str:
    from gateway.inference.types import Tool

    tool = Tool(WEATHER["name"], WEATHER["description"], WEATHER["parameters"])
    prompt = PromptTemplate("chatml").render(messages, (tool,), None)
    return "".join(generate_pieces(prompt.encode(), max_tokens))


def test_a_streamed_answer_parses_event_by_event(client: OpenAI) -> None:
    events = list(client.responses.create(model="local", input="Hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text == expected_text([ChatMessage("user", "Hi")], 256)
    assert "response.output_text.done" in kinds and "response.output_item.done" in kinds


def test_a_streamed_function_call_comes_in_argument_deltas(client: OpenAI) -> None:
    with client.responses.stream(model="local", input=ASK, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


# Codex CLI's kinds of tools: a namespace of functions, and a hosted tool no model here runs.
AGENTS: Any = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [WEATHER],
}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}
CODEX_TOOLS = json.loads(
    (Path(__file__).parents[1] / "unit" / "api" / "codex_0.171.0_tools.json").read_text()
)


def test_a_namespaced_function_is_called_and_the_hosted_tool_named_as_left_out(
    client: OpenAI,
) -> None:
    raw = client.responses.with_raw_response.create(
        model="local", input=ASK, tools=[WEB_SEARCH, AGENTS]
    )
    assert raw.headers["x-gateway-omitted-tools"] == "web_search"
    first = raw.parse()
    assert [tool.type for tool in first.tools] == ["web_search", "namespace"]  # as sent
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("get_weather", "multi_agent_v1")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # Its output continues the conversation, as with any function.
    second = client.responses.create(
        model="local",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[WEB_SEARCH, AGENTS],
        max_output_tokens=16,
    )
    assert [item.type for item in second.output] == ["message"]


def test_a_streamed_namespaced_call_carries_its_namespace(client: OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model="local", input=ASK, tools=[AGENTS, WEB_SEARCH], stream=True
    )
    assert raw.headers["x-gateway-omitted-tools"] == "web_search"
    events = list(raw.parse())
    (added,) = [e.item for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
    (done,) = [e.item for e in events if e.type == "response.output_item.done"]  # type: ignore[union-attr]
    for item in (added, done):
        assert item.type == "function_call"
        assert (item.name, item.namespace) == ("get_weather", "multi_agent_v1")
    final = events[-1].response  # type: ignore[union-attr]
    (call,) = final.output
    assert (call.name, call.namespace) == ("get_weather", "multi_agent_v1")


def test_codex_cli_first_request_tools_are_served(client: OpenAI) -> None:
    # The fields of Codex CLI 0.171.0's first request, with its captured tools.
    body = {
        "model": "local", "input": ASK, "tools": CODEX_TOOLS, "tool_choice": "auto",
        "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "stream": True,
    }  # fmt: skip
    raw = client.responses.with_raw_response.create(**body)
    assert raw.headers["x-gateway-omitted-tools"] == "web_search"
    final = list(raw.parse())[-1]
    assert final.type == "response.completed"


def test_a_stored_response_is_read_and_deleted_by_its_tenant_only(
    client: OpenAI, gateway: Gateway
) -> None:
    reply = client.responses.create(model="local", input="Hi", max_output_tokens=4)
    assert client.responses.retrieve(reply.id).output_text == reply.output_text
    other = OpenAI(base_url=gateway.base_url, api_key="sk-test-globex", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError) as caught:
        other.responses.create(model="local", input="Hi", previous_response_id=reply.id)
    assert caught.value.param == "previous_response_id"
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_store_false_keeps_nothing(client: OpenAI) -> None:
    reply = client.responses.create(model="local", input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
        ),
        (
            {"tools": [{"type": "web_search"}], "tool_choice": {"type": "file_search"}},
            "tool_choice",
        ),
        ({"tools": [{"type": "namespace", "name": "ns", "tools": []}]}, "tools[0].tools"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    client: OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as caught:
        client.post("/responses", body={"model": "local", "input": "Hi", **fields}, cast_to=object)
    assert caught.value.param == param  # type: ignore[union-attr]


def test_an_agents_sdk_agent_runs_its_tool_to_a_final_answer(gateway: Gateway) -> None:
    # Its default model name, routed to the local model by an alias.
    assert get_default_model() in DEFAULT_NAMES
    client = AsyncOpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"18 C in {city}"

    agent = Agent(name="weather", instructions="Answer about the weather.", tools=[get_weather])
    result = Runner.run_sync(agent, ASK)
    assert len(calls) == 1  # the tool ran once, with the arguments the model wrote
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
