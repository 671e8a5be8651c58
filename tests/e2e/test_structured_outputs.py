"""Structured outputs with the SDK's `parse()`: guided decoding on a Triton model (the
simulator), the answer checked against the schema, and what a client gets when a
backend answers JSON the schema does not allow."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant
from tests.e2e.tool_upstream import ToolModel
from tests.e2e.upstreams import serve_in_thread

STRUCTURED = {"capabilities": {"structured_outputs": True}, "max_tokens_default": 128}
ASK = [{"role": "user", "content": "Describe Paris."}]


class City(BaseModel):
    name: str
    population: int
    districts: list[str]
    capital: bool


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    upstream = ToolModel()
    with serve_in_thread([upstream.app()]) as urls:
        models = {
            "json-http": model(
                "triton_http", [a.http_url], upstream_model="llm-small", **STRUCTURED
            ),
            "json-grpc": model(
                "triton_grpc", [a.grpc_target], upstream_model="llm-small", **STRUCTURED
            ),
            "careless": model("openai", urls, **STRUCTURED),
            "text-only": model("triton_http", [a.http_url], upstream_model="llm-small"),
        }
        with running_gateway(
            tmp_path_factory.mktemp("structured"), models, redis_url,
            tenants={"acme": tenant("acme", ["*"])},
        ) as gw:  # fmt: skip
            yield gw


@pytest.fixture
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


@pytest.mark.parametrize("name", ["json-http", "json-grpc"])
def test_parse_with_a_pydantic_model(client: OpenAI, name: str) -> None:
    reply = client.chat.completions.parse(model=name, messages=ASK, response_format=City)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and isinstance(city.districts, list)


def test_json_object_and_streamed_json_schema(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="json-http", messages=ASK, response_format={"type": "json_object"}
    )
    assert (reply.choices[0].message.content or "").startswith("{")
    with client.chat.completions.stream(
        model="json-grpc", messages=ASK, response_format=City
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, City)


def test_an_answer_the_schema_does_not_allow_is_a_502_naming_the_problem(client: OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.parse(model="careless", messages=ASK, response_format=City)
    assert failed.value.status_code == 502
    assert failed.value.code == "invalid_structured_output"
    assert "it fails `required`" in failed.value.message
    # The same request would get the same answer: the SDK is told not to try again.
    assert failed.value.response.headers["x-should-retry"] == "false"
    # Streamed: the text has gone out, and the stream ends with that error, not a finish.
    with pytest.raises(openai.APIError) as cut:
        list(
            client.chat.completions.create(
                model="careless", messages=ASK, stream=True,
                response_format={"type": "json_schema", "json_schema": {
                    "name": "City", "schema": City.model_json_schema()}},
            )
        )  # fmt: skip
    assert (
        "invalid_structured_output" in str(cut.value.body) or "response_format" in cut.value.message
    )


@pytest.mark.parametrize("name", ["json-http", "json-grpc"])
def test_an_answer_cut_at_its_token_limit_is_reported_as_cut(client: OpenAI, name: str) -> None:
    # Not a 502 (that the SDK retried three times, each charged): the cut answer, with
    # `finish_reason: "length"`, which the SDK's `parse` raises as its own error.
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=name, messages=ASK, response_format=City, max_tokens=5)
    chunks = list(
        client.chat.completions.create(
            model=name, messages=ASK, stream=True, max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {
                "name": "City", "schema": City.model_json_schema()}},
        )
    )  # fmt: skip
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_model_without_structured_outputs_refuses_them(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="text-only", messages=ASK, response_format={"type": "json_object"}
        )
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == "response_format"
