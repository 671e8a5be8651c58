"""`/v1/embeddings` with the official SDK as the client: a Triton embedding model (the
simulator's, over HTTP and gRPC) through the standard `infer` API, an OpenAI-compatible
upstream (the gateway relaying to itself), vectors as numbers and as base64, batches
split across replicas, shorter vectors, usage charged to the token limit, and bad input
refused by name."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openai import BadRequestError, OpenAI, RateLimitError

from gateway_tools.dev.sim.embedding_template import count_input_tokens, embed_texts
from gateway_tools.dev.sim.repository import EMBEDDING_DIMENSIONS
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, replica_requests, running_gateway, tenant

TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on the mat.",
    "Quarterly revenue grew by eight percent.",
]


def embeddings(**settings: Any) -> dict[str, Any]:
    spec = {"dimensions": EMBEDDING_DIMENSIONS, "max_inputs": 40, "max_input_tokens": 64}
    return {"capabilities": {"embeddings": {**spec, **settings}}}


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, b = sims
    up = {"upstream_model": "embed-small"}
    models = {
        "embed-http": model(
            "triton_http", [a.http_url, b.http_url], **up,
            **embeddings(shortenable=True, max_batch=4),
        ),
        "embed-grpc": model("triton_grpc", [a.grpc_target], **up, **embeddings()),
        "embed-relay": model(
            "openai", ["${SELF_URL}"], upstream_model="embed-http", api_key="${RELAY_KEY}",
            **embeddings(shortenable=True),
        ),
        "llm-small": model("triton_http", [a.http_url]),
    }  # fmt: skip
    tenants = {
        "acme": tenant("acme", ["*"]),
        "embed-frugal": tenant(
            "embed-frugal", ["*"], limits={"tokens_per_minute": 60, "burst_tokens": 30}
        ),
    }
    with running_gateway(
        tmp_path_factory.mktemp("embeddings"), models, redis_url, tenants=tenants,
        env={"RELAY_KEY": "sk-test-acme"},
    ) as gw:  # fmt: skip
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


def expected(texts: list[str], dimensions: int = EMBEDDING_DIMENSIONS) -> np.ndarray:
    vectors = embed_texts(texts, EMBEDDING_DIMENSIONS)[:, :dimensions]
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("name", ["embed-http", "embed-grpc", "embed-relay"])
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_vectors_are_the_models_in_either_encoding(
    client: OpenAI, name: str, encoding: Any
) -> None:
    reply = client.embeddings.create(model=name, input=TEXTS, encoding_format=encoding)
    assert reply.object == "list" and reply.model == name
    assert [item.index for item in reply.data] == [0, 1, 2]
    # Asked for explicitly, base64 comes as it is sent (the SDK decodes only its default).
    got = np.array([vector(item.embedding) for item in reply.data], dtype=np.float32)
    np.testing.assert_allclose(got, expected(TEXTS), atol=1e-6)
    prompt_tokens = sum(count_input_tokens(text.encode()) for text in TEXTS)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == prompt_tokens


def vector(embedding: Any) -> Any:
    """A vector as numbers, or OpenAI's base64 of little-endian float32."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return embedding


def test_the_sdks_default_request_gets_vectors_near_for_similar_texts(client: OpenAI) -> None:
    # The SDK asks for base64 unless told otherwise, and decodes it itself.
    first, second, other = (item.embedding for item in client.embeddings.create(
        model="embed-http", input=TEXTS
    ).data)  # fmt: skip
    assert len(first) == EMBEDDING_DIMENSIONS
    assert np.dot(first, second) > np.dot(first, other) + 0.2


def test_a_long_list_is_split_into_batches_across_replicas_in_order(
    client: OpenAI, gateway: Gateway
) -> None:
    texts = [f"document number {i} about {'cats' if i % 2 else 'revenue'}" for i in range(10)]
    before = replica_requests(gateway, "embed-http")
    reply = client.embeddings.create(model="embed-http", input=texts, encoding_format="float")
    got = np.array([item.embedding for item in reply.data], dtype=np.float32)
    np.testing.assert_allclose(got, expected(texts), atol=1e-6)
    after = replica_requests(gateway, "embed-http")
    sent = {url: after[url] - before.get(url, 0) for url in after}
    # max_batch 4: ten texts in three upstream requests, sent at once to both replicas.
    assert sum(sent.values()) == 3
    assert all(count >= 1 for count in sent.values()) and len(sent) == 2


@pytest.mark.parametrize("name", ["embed-http", "embed-relay"])
def test_shorter_vectors_are_unit_vectors_of_the_leading_coordinates(
    client: OpenAI, name: str
) -> None:
    reply = client.embeddings.create(
        model=name, input=TEXTS, dimensions=64, encoding_format="float"
    )
    got = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert got.shape == (3, 64)
    np.testing.assert_allclose(got, expected(TEXTS, 64), atol=1e-6)


def test_inputs_are_charged_to_the_tenants_token_limit(gateway: Gateway) -> None:
    # 30 tokens of burst, refilled at one a second: the texts' 24 tokens pass once. The
    # tenant is this module's own: buckets live in the session's Redis, shared by modules.
    client = OpenAI(base_url=gateway.base_url, api_key="sk-test-embed-frugal", max_retries=0)
    raw = client.embeddings.with_raw_response.create(model="embed-grpc", input=TEXTS)
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == 30 - 24
    with pytest.raises(RateLimitError) as caught:
        client.embeddings.create(model="embed-grpc", input=TEXTS)
    assert int(caught.value.response.headers["retry-after"]) >= 1


@pytest.mark.parametrize(
    ("name", "fields", "param"),
    [
        ("embed-http", {"input": ""}, "input"),
        ("embed-http", {"input": []}, "input"),
        ("embed-http", {"input": ["ok", ""]}, "input[1]"),
        ("embed-http", {"input": [[1, 2, 3]]}, "input[0]"),
        ("embed-http", {"input": ["x"] * 41}, "input"),
        ("embed-http", {"input": "word " * 60}, "input"),
        ("embed-http", {"input": "x", "dimensions": 512}, "dimensions"),
        ("embed-grpc", {"input": "x", "dimensions": 64}, "dimensions"),
        ("embed-http", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ("llm-small", {"input": "x"}, "model"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client: OpenAI, name: str, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.post("/embeddings", body={"model": name, **fields}, cast_to=object)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_chat_with_an_embedding_model_is_a_400(client: OpenAI) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(
            model="embed-http", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.code == "model_not_supported"
    assert "/v1/embeddings" in caught.value.message
