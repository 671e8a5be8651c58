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
import openai as openai_errors
import pytest
from openai import OpenAI

from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from gateway_tools.dev.sim.model_template import generate_pieces
from gateway_tools.dev.sim.server import TritonSim
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
    # Models whose limit is far below what Claude Code asks for (32,000): one clamps it
    # (the default policy), one refuses it.
    models["short"] = model("triton_grpc", [a.grpc_target], upstream_model="llm-small",
                            max_tokens_limit=8)  # fmt: skip
    models["strict"] = model("triton_grpc", [a.grpc_target], upstream_model="llm-small",
                             max_tokens_limit=8, max_tokens_policy="refuse")  # fmt: skip
    # A budget a clamped request fits in, but 32,000 reserved tokens would not.
    tenants["modest"] = tenant(
        "modest", ["*"], limits={"tokens_per_minute": 300, "burst_tokens": 300}
    )
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
    turns: Any = [
        *ASK,
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": [result]},
    ]
    final = client.messages.create(model="local", max_tokens=32, tools=[WEATHER], messages=turns)
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


HI: Any = [{"role": "user", "content": "Hi"}]


def test_claude_codes_first_request_is_answered(client: anthropic.Anthropic) -> None:
    # The shape of Claude Code 2.1.197's first request: a system message last in
    # `messages`, cached blocks, beta fields the gateway does not use.
    cached: Any = {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
    reply = client.messages.create(
        model="local",
        max_tokens=8,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [cached]},
            {"role": "system", "content": "Agents: Explore."},
        ],
        metadata={"user_id": '{"session_id": "s"}'},
        extra_body={
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "output_config": {"effort": "high"},
        },
        extra_headers={"anthropic-beta": "claude-code-20250219,mid-conversation-system-2026-04-07"},
    )
    prompt = PromptTemplate("chatml").render(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Hi"),
            ChatMessage("system", "Agents: Explore."),
        ]
    )
    (block,) = reply.content
    assert block.type == "text" and block.text == "".join(generate_pieces(prompt.encode(), 8))


def test_an_earlier_answers_thinking_and_server_tool_blocks_are_dropped(
    client: anthropic.Anthropic,
) -> None:
    earlier: Any = [
        {"type": "thinking", "thinking": "Hm.", "signature": "sig"},
        {"type": "redacted_thinking", "data": "xx"},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "text", "text": "Hello."},
    ]
    messages: Any = [*HI, {"role": "assistant", "content": earlier}, *HI]
    reply = client.messages.create(model="local", max_tokens=4, messages=messages)
    plain: Any = [*HI, {"role": "assistant", "content": "Hello."}, *HI]
    same = client.messages.create(model="local", max_tokens=4, messages=plain)
    assert reply.content[0].text == same.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("block", [{"type": "image", "source": {}}, {"type": "document"}])
def test_a_block_the_model_would_need_is_a_400_naming_it(
    client: anthropic.Anthropic, block: dict[str, Any]
) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "system", "content": [block]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post(
            "/v1/messages",
            body={"model": "local", "max_tokens": 8, "messages": messages},
            cast_to=object,
        )
    assert "messages[1].content[0].type" in caught.value.body["error"]["message"]  # type: ignore[index]


def test_max_tokens_above_the_models_limit_is_clamped(gateway: Gateway) -> None:
    # Claude Code asks for 32,000; the model takes 8. Reserved at 8, the request fits
    # the modest tenant's budget, and the answer is cut at the limit.
    modest = anthropic.Anthropic(base_url=gateway.url, api_key="sk-test-modest", max_retries=0)
    # (Unstreamed, the SDK wants a timeout of its own for that many tokens.)
    reply = modest.messages.create(model="short", max_tokens=32000, messages=HI, timeout=30)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 8
    assert reply.content[0].text == expected_text(None, "Hi", 8)  # type: ignore[union-attr]
    with modest.messages.stream(model="short", max_tokens=32000, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_every_wire_is_clamped_alike(gateway: Gateway) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key="sk-test-modest", max_retries=0)
    for field in ("max_tokens", "max_completion_tokens"):
        chat = client.chat.completions.create(
            model="short",
            messages=HI,
            **{field: 32000},  # type: ignore[call-overload]
        )
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 8
    response = client.responses.create(model="short", input="Hi", max_output_tokens=32000)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 8


def test_a_refusing_model_answers_400_naming_the_field(
    gateway: Gateway, client: anthropic.Anthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="strict", max_tokens=32000, messages=HI, timeout=30)
    assert caught.value.body["error"]["message"] == "`max_tokens` may be at most 8 for `strict`."  # type: ignore[index]
    assert client.messages.create(model="strict", max_tokens=8, messages=HI).stop_reason == (
        "max_tokens"
    )
    chat = OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai_errors.BadRequestError) as refused:
            chat.chat.completions.create(
                model="strict",
                messages=HI,
                **{field: 9},  # type: ignore[call-overload]
            )
        assert refused.value.param == field
    with pytest.raises(openai_errors.BadRequestError) as refused:
        chat.responses.create(model="strict", input="Hi", max_output_tokens=10**9)
    assert refused.value.param == "max_output_tokens"


@pytest.mark.parametrize("value", [0, -1, 10**9, 10**30, "8", True, 1.5, None, [8], {"n": 8}])
@pytest.mark.parametrize("model_name", ["short", "strict"])
def test_a_max_tokens_that_cannot_be_served_is_a_400_naming_it(
    gateway: Gateway, client: anthropic.Anthropic, value: Any, model_name: str
) -> None:
    # 10**9 is a count the short model clamps; 10**30 is past any integer JSON parsers
    # keep (a float to orjson): refused as not an integer.
    if value == 10**9 and model_name == "short":
        return
    body = {"model": model_name, "max_tokens": value, "messages": HI}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body=body, cast_to=object)
    assert "`max_tokens`" in caught.value.body["error"]["message"]  # type: ignore[index]
    if value is None:
        return  # the chat and Responses APIs take the model's default
    chat = OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)
    for path, field in (("/chat/completions", "max_tokens"), ("/responses", "max_output_tokens")):
        payload = {"model": model_name, field: value}
        payload.update({"messages": HI} if path == "/chat/completions" else {"input": "Hi"})
        with pytest.raises(openai_errors.BadRequestError) as refused:
            chat.post(path, body=payload, cast_to=object)
        assert refused.value.param == field
