"""A model served by Triton's vLLM backend or TensorRT-LLM's in-flight batcher: the
gateway speaks each one's inputs (`triton_interface`), against a real Triton whose
simulated models take exactly those inputs (gateway_tools/dev/sim: `interface`).

What a wrong request does there, as the real backends do: vLLM's puts the prompt before a
whole answer unless `exclude_input_in_output` says not to, reads a stop list only from
`sampling_parameters`, and reports token counts only when asked."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.model_template import count_input_tokens, generate_pieces
from gateway_tools.dev.sim.repository import ModelProfile
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import start_sim_profiles
from tests.e2e.stack import KEYS, Gateway, model, start_gateway, tenant

DATA = Path(__file__).parents[1] / "data" / "tokenizer_configs"
QWEN_CONFIG = DATA / "qwen2.5-7b-instruct" / "tokenizer_config.json"
INTERFACES = ["vllm", "tensorrtllm"]
HELLO = [{"role": "user", "content": "Name three colours."}]
# What Qwen2.5's own template makes of HELLO: the prompt the model must be given.
HELLO_PROMPT = (
    b"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    b"assistant.<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n"
    b"<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def sim() -> Iterator[TritonSim]:
    profiles = [
        ModelProfile(f"qwen-{interface}", 0.001, 0.00001, interface=interface)
        for interface in INTERFACES
    ]
    sim = start_sim_profiles(profiles)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def gateway(
    sim: TritonSim, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    models = {
        f"qwen-{interface}": model(
            "triton_http",
            [sim.http_url],
            triton_interface=interface,
            prompt_template=str(QWEN_CONFIG),
            capabilities={"structured_outputs": True},
        )
        for interface in INTERFACES
    }
    tenants = {"acme": tenant("acme", ["*"])}
    gw = start_gateway(tmp_path_factory.mktemp("interfaces"), models, redis_url, tenants=tenants)
    try:
        yield gw
    finally:
        stop(gw.process)


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)


def generate(sim: TritonSim, model_name: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{sim.http_url}/v2/models/{model_name}/generate", data=json.dumps(body).encode()
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


def test_the_imitated_vllm_backend_answers_a_generic_request_as_vllm_would(
    sim: TritonSim,
) -> None:
    # The generic convention's body, sent to a vLLM model: the prompt comes back first,
    # no counts, and the stop list (a request parameter of JSON text) is one string.
    answer = generate(
        sim, "qwen-vllm", {"text_input": "Hi there", "max_tokens": 4, "stop": '["x"]'}
    )
    assert str(answer["text_output"]).startswith("Hi there")
    assert "num_output_tokens" not in answer


@pytest.mark.parametrize("interface", INTERFACES)
def test_a_whole_answer_is_the_models_text_with_its_counts(client: OpenAI, interface: str) -> None:
    answer = client.chat.completions.create(
        model=f"qwen-{interface}",
        messages=HELLO,
        max_tokens=12,
        seed=3,  # type: ignore[arg-type]
    )
    expected = "".join(generate_pieces(HELLO_PROMPT, 12, 3))
    assert answer.choices[0].message.content == expected
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == count_input_tokens(HELLO_PROMPT)
    assert answer.usage.completion_tokens == len(generate_pieces(HELLO_PROMPT, 12, 3))


@pytest.mark.parametrize("interface", INTERFACES)
def test_a_stream_is_the_same_text_and_its_usage(client: OpenAI, interface: str) -> None:
    stream = client.chat.completions.create(
        model=f"qwen-{interface}",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=12,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    pieces = generate_pieces(HELLO_PROMPT, 12, 3)
    assert text == "".join(pieces)
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        count_input_tokens(HELLO_PROMPT),
        len(pieces),
    )


@pytest.mark.parametrize("interface", INTERFACES)
def test_each_stop_string_of_a_list_stops_the_answer(client: OpenAI, interface: str) -> None:
    whole = "".join(generate_pieces(HELLO_PROMPT, 40))
    words = whole.split()
    # Two stop strings: the second is the one the text reaches first.
    stops = [f"{words[5]} {words[6]}", f" {words[2]} "]
    answer = client.chat.completions.create(
        model=f"qwen-{interface}",
        messages=HELLO,
        max_tokens=40,
        stop=stops,  # type: ignore[arg-type]
    )
    expected = "".join(generate_pieces(HELLO_PROMPT, 40, None, stops))
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"
    assert f" {words[2]} " not in (answer.choices[0].message.content or "")


@pytest.mark.parametrize("interface", INTERFACES)
def test_a_json_schema_is_asked_for_as_the_backend_reads_it(client: OpenAI, interface: str) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model=f"qwen-{interface}",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "c", "schema": schema, "strict": True},
        },
    )
    parsed = json.loads(answer.choices[0].message.content or "")
    assert set(parsed) == {"colour", "count"} and isinstance(parsed["count"], int)


@pytest.mark.parametrize("interface", INTERFACES)
def test_a_negative_seed_is_served_not_blamed_on_the_replica(
    client: OpenAI, interface: str
) -> None:
    # TensorRT-LLM's seed input is unsigned: -1 made Triton answer 500, and the gateway
    # ejected the replica for every tenant (issue 42's hostile review).
    for _ in range(3):
        answer = client.chat.completions.create(
            model=f"qwen-{interface}",
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=8,
            seed=-1,
        )
        assert answer.choices[0].message.content
