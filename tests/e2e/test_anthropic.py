"""`POST /v1/messages` with the official `anthropic` SDK as the client, against a Triton
model (the simulator, with Hermes tool calls): text and a tool-use round trip, created
and streamed (the SDK's typed parsers and its stream accumulator are the conformance
check), `count_tokens`, both ways of giving the key, errors in Anthropic's shape, and
one token budget shared with the chat API."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from openai import OpenAI

from gateway.dev.sim.model_template import generate_pieces
from gateway.dev.sim.server import TritonSim
from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from tests.e2e.stack import Gateway, model, running_gateway, tenant

HERMES = {"capabilities": {"tools": True, "tool_parser": "hermes"}, "max_tokens_limit": 512}
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    models = {
        "local": model(
            "triton_grpc", [a.grpc_target], upstream_model="llm-small",
            aliases=["claude-sonnet-5-5"], **HERMES,
        ),
    }  # fmt: skip
    tenants = {
        "acme": tenant("acme", ["*"]),
        "frugal": tenant("frugal", ["*"], limits={"tokens_per_minute": 60, "burst_tokens": 60}),
    }
    models["slow"] = model("triton_http", [a.http_url], upstream_model="llm-slow")
    # Pings while a slow model (40 ms a token) is between two tokens.
    server = {"server": {"stream_ping_interval_s": 0.01}}
    with running_gateway(
        tmp_path_factory.mktemp("anthropic"), models, redis_url, tenants=tenants, gateway=server
    ) as gw:
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> anthropic.Anthropic:
    # The SDK sends the key as `x-api-key`, with `anthropic-version`.
    return anthropic.Anthropic(base_url=gateway.url, api_key="sk-test-acme", max_retries=0)


def expected_text(system: str | None, user: str, max_tokens: int) -> str:
    messages = [ChatMessage("system", system)] if system else []
    prompt = PromptTemplate("chatml").render([*messages, ChatMessage("user", user)])
    return "".join(generate_pieces(prompt.encode(), max_tokens))


def test_a_text_answer_is_a_message(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(
        model="local",
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "local"
    assert reply.id.startswith("msg_")
    (block,) = reply.content
    assert block.type == "text" and block.text == expected_text("Be brief.", "Hi", 8)
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 8 and reply.usage.input_tokens > 0


def test_a_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(model="local", max_tokens=256, messages=ASK, tools=[WEATHER])
    assert reply.stop_reason == "tool_use"
    (use,) = [block for block in reply.content if block.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
    final = client.messages.create(
        model="local",
        max_tokens=32,
        tools=[WEATHER],
        messages=[
            *ASK,
            {"role": "assistant", "content": reply.content},  # type: ignore[typeddict-item]
            {"role": "user", "content": [result]},
        ],
    )
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in final.content] == ["text"]


def test_a_streamed_answer_parses_event_by_event(client: anthropic.Anthropic) -> None:
    kinds = []
    with client.messages.stream(
        model="local", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].type == "text"
    assert final.content[0].text == expected_text(None, "Hi", 8)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_a_streamed_tool_use_builds_its_input_from_json_deltas(
    client: anthropic.Anthropic,
) -> None:
    with client.messages.stream(
        model="local", max_tokens=256, messages=ASK, tools=[WEATHER]
    ) as stream:
        deltas = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert len([d for d in deltas if d.delta.type == "input_json_delta"]) > 1
    (use,) = [block for block in final.content if block.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use"


def test_count_tokens_is_the_prompts_estimate(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(
        model="local", messages=[{"role": "user", "content": "Hi"}]
    )
    longer = client.messages.count_tokens(model="local", messages=ASK, tools=[WEATHER])
    assert 0 < short.input_tokens < longer.input_tokens


def test_a_tools_default_model_name_reaches_the_local_model(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(
        model="claude-sonnet-5-5", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.model == "local" and reply.usage.output_tokens == 2


def test_a_bearer_key_works_too(gateway: Gateway) -> None:
    bearer = anthropic.Anthropic(base_url=gateway.url, auth_token="sk-test-acme", max_retries=0)
    reply = bearer.messages.create(
        model="local", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.usage.output_tokens == 2


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"max_tokens": None}, anthropic.BadRequestError, "`max_tokens` is required"),
        ({"model": "nope"}, anthropic.NotFoundError, "nope"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            anthropic.BadRequestError,
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    }
                ]
            },
            anthropic.BadRequestError,
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            anthropic.BadRequestError,
            "tools[0].type",
        ),
    ],
)
def test_bad_requests_are_answered_in_anthropics_error_shape(
    client: anthropic.Anthropic, fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    body = {"model": "local", "max_tokens": 8, "messages": ASK, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(error) as caught:
        client.post("/v1/messages", body=body, cast_to=object)
    payload = caught.value.body  # type: ignore[attr-defined]
    assert payload["type"] == "error"
    assert message in payload["error"]["message"]


def test_a_wrong_key_is_an_authentication_error(gateway: Gateway) -> None:
    wrong = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model="local", max_tokens=2, messages=ASK)
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_one_token_budget_across_the_chat_and_messages_apis(gateway: Gateway) -> None:
    # 60 tokens of burst: a chat request reserving 50 leaves too few for the next.
    chat = OpenAI(base_url=gateway.base_url, api_key="sk-test-frugal", max_retries=0)
    chat.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Hi"}], max_tokens=40
    )
    frugal = anthropic.Anthropic(base_url=gateway.url, api_key="sk-test-frugal", max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as caught:
        frugal.messages.create(
            model="local", max_tokens=40, messages=[{"role": "user", "content": "Hi"}]
        )
    headers = caught.value.response.headers
    assert int(headers["retry-after"]) >= 1
    assert headers["anthropic-ratelimit-tokens-limit"] == "60"
    assert int(headers["anthropic-ratelimit-tokens-remaining"]) < 40
    assert headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_the_access_log_and_metrics_name_the_endpoint(
    client: anthropic.Anthropic, gateway: Gateway
) -> None:
    reply = client.messages.create(
        model="local", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    record = gateway.access_record(reply.id)
    assert (record["endpoint"], record["tenant"], record["status"]) == ("messages", "acme", 200)
    exposition = urllib.request.urlopen(f"{gateway.ops_url}/metrics").read().decode()
    assert 'gateway_requests_total{endpoint="messages",model="local"' in exposition


def test_a_stream_waiting_for_a_slow_model_sends_pings(gateway: Gateway) -> None:
    body = {
        "model": "slow",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    with httpx.stream(
        "POST", f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": "sk-test-acme"}
    ) as response:
        names = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    between = names[names.index("content_block_start") : names.index("content_block_stop")]
    assert between.count("content_block_delta") == 5
    assert "ping" in between  # sent while the next token was being made


def test_a_client_leaving_a_stream_ends_it_cleanly(
    client: anthropic.Anthropic, gateway: Gateway
) -> None:
    with client.messages.stream(
        model="slow", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        first = next(iter(stream))
        message_id = first.message.id  # type: ignore[union-attr]
    record = gateway.access_record(message_id)
    assert (record["endpoint"], record["status"]) == ("messages", 499)
    assert "Traceback" not in gateway.log
