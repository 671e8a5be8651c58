"""Log probabilities from Triton models (the simulator returns TensorRT-LLM's
`output_log_probs`), with the official SDK as the client, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import BadRequestError, OpenAI

from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from gateway_tools.dev.sim.model_template import generate_pieces, token_logprob
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant

ASK = [{"role": "user", "content": "How sure are you?"}]
PROMPT = PromptTemplate("chatml").render([ChatMessage("user", "How sure are you?")]).encode()


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    logprobs = {"upstream_model": "llm-small", "capabilities": {"logprobs": True}}
    models = {
        "lp-http": model("triton_http", [a.http_url], **logprobs),
        "lp-grpc": model("triton_grpc", [a.grpc_target], **logprobs),
        "plain": model("triton_http", [a.http_url], upstream_model="llm-small"),
    }
    with running_gateway(
        tmp_path_factory.mktemp("logprobs"), models, redis_url,
        tenants={"acme": tenant("acme", ["*"])},
    ) as gw:  # fmt: skip
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="sk-test-acme", max_retries=0)


def expected(seed: int) -> list[tuple[str, float]]:
    # float32 on the wire: rounded as it is.
    pieces = generate_pieces(PROMPT, 8, seed)
    return [(piece, round(token_logprob(PROMPT, seed, i), 3)) for i, piece in enumerate(pieces)]


@pytest.mark.parametrize("name", ["lp-http", "lp-grpc"])
def test_each_token_comes_with_its_log_probability(client: OpenAI, name: str) -> None:
    reply = client.chat.completions.create(
        model=name, messages=ASK, logprobs=True, max_tokens=8, seed=5
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    got = [(entry.token, round(entry.logprob, 3)) for entry in choice.logprobs.content]
    assert got == expected(5)
    assert "".join(token for token, _ in got) == choice.message.content
    assert choice.logprobs.content[0].bytes == list(got[0][0].encode())


@pytest.mark.parametrize("name", ["lp-http", "lp-grpc"])
def test_streamed_tokens_carry_their_log_probability(client: OpenAI, name: str) -> None:
    got = []
    for chunk in client.chat.completions.create(
        model=name, messages=ASK, logprobs=True, max_tokens=8, seed=6, stream=True
    ):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                got += [(entry.token, round(entry.logprob, 3)) for entry in choice.logprobs.content]
    assert got == expected(6)


@pytest.mark.parametrize(
    ("name", "fields", "param"),
    [
        ("lp-http", {"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ("plain", {"logprobs": True}, "logprobs"),
    ],
)
def test_what_a_model_cannot_return_is_a_400_naming_it(
    client: OpenAI, name: str, fields: dict[str, object], param: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=name, messages=ASK, **fields)  # type: ignore[call-overload]
    assert caught.value.param == param
    assert name in caught.value.message
