"""langchain-openai as its users run it against the gateway: `ChatOpenAI` with tools
bound (`bind_tools`) and with structured output (`with_structured_output`), on a Triton
model (the simulator) with tool calling and guided decoding; `OpenAIEmbeddings` on the
simulator's embedding model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel

from gateway_tools.dev.sim.embedding_template import embed_texts
from gateway_tools.dev.sim.repository import EMBEDDING_DIMENSIONS
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant

CAPABLE = {
    "capabilities": {"tools": True, "tool_parser": "hermes", "structured_outputs": True},
    "max_tokens_default": 128,
}


@tool
def get_weather(city: str, unit: str = "C") -> str:
    """The weather in a city."""
    return f"18 {unit} in {city}"


class City(BaseModel):
    name: str
    population: int


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    embeddings = {"capabilities": {"embeddings": {"dimensions": EMBEDDING_DIMENSIONS}}}
    models = {
        "agent": model("triton_grpc", [a.grpc_target], upstream_model="llm-small", **CAPABLE),
        "embed": model("triton_http", [a.http_url], upstream_model="embed-small", **embeddings),
    }
    with running_gateway(
        tmp_path_factory.mktemp("langchain"), models, redis_url,
        tenants={"acme": tenant("acme", ["*"])},
    ) as gw:  # fmt: skip
        yield gw


@pytest.fixture
def llm(gateway: Gateway) -> ChatOpenAI:
    return ChatOpenAI(
        model="agent", base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_bind_tools_then_answer_the_tool_result(llm: ChatOpenAI, streaming: bool) -> None:
    agent = llm.bind_tools([get_weather])
    question = HumanMessage("What is the weather in Paris?")
    if streaming:
        reply = None
        for chunk in agent.stream([question]):
            reply = chunk if reply is None else reply + chunk
    else:
        reply = agent.invoke([question])
    assert reply is not None
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = agent.invoke([question, reply, result])
    assert final.content and not final.tool_calls


def test_with_structured_output(llm: ChatOpenAI) -> None:
    city = llm.with_structured_output(City, method="json_schema").invoke("Describe Paris.")
    assert isinstance(city, City)
    tool_city = llm.with_structured_output(City, method="function_calling").invoke("Paris?")
    assert isinstance(tool_city, City)


def test_openai_embeddings_embeds_documents_and_a_query(gateway: Gateway) -> None:
    embedder = OpenAIEmbeddings(
        model="embed",
        base_url=gateway.base_url,
        api_key="sk-test-acme",  # type: ignore[arg-type]
        max_retries=0,
        # Its default sends token ids counted by OpenAI's tokenizer; a gateway in front
        # of other models takes text (as langchain documents for non-OpenAI providers).
        check_embedding_ctx_length=False,
    )
    documents = ["The cat sat on the mat.", "Revenue grew by eight percent."]
    vectors = embedder.embed_documents(documents)
    query = embedder.embed_query("Where did the cat sit?")
    assert np.allclose(vectors, embed_texts(documents, EMBEDDING_DIMENSIONS), atol=1e-6)
    assert np.dot(query, vectors[0]) > np.dot(query, vectors[1])
