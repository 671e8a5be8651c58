"""The model repositories of deploy/triton/ (Qwen2.5-7B-Instruct on Triton's vLLM backend
and on TensorRT-LLM's in-flight batcher) and the gateway config that serves them.

No GPU is here, so nothing in them is served; what can be checked without one is:
each config.pbtxt is read by Triton's own `ModelConfig` protobuf (as `tritonserver` reads
it: an unknown field or a wrong type fails), model.json holds vLLM engine arguments, the
ensemble is whole, every input the gateway sends is one the backend declares, and
gateway.yaml passes check-config. The requests themselves are run against a real Triton
whose simulated models take these inputs in tests/e2e/test_triton_interfaces.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from gateway.backends.triton_http import generate_body
from gateway.config.loader import check_config
from gateway.config.schema import TritonInterface
from gateway.inference.types import (
    ChatOptions,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    UpstreamCall,
)

ROOT = Path(__file__).parents[3]
TRITON = ROOT / "deploy" / "triton"
VLLM_MODEL = TRITON / "vllm" / "qwen2.5-7b-instruct"
ENSEMBLE = TRITON / "tensorrtllm" / "ensemble"
QWEN_TOKENIZER = ROOT / "tests/data/tokenizer_configs/qwen2.5-7b-instruct/tokenizer_config.json"

# The inputs Triton's vLLM backend takes (its auto-completed config, src/model.py).
VLLM_BACKEND_INPUTS = {
    "text_input", "image", "stream", "sampling_parameters", "exclude_input_in_output",
    "return_finish_reason", "return_cumulative_logprob", "return_logprobs",
    "return_num_input_tokens", "return_num_output_tokens",
}  # fmt: skip
# vLLM's documented engine arguments that model.json may set, with their JSON types
# (docs.vllm.ai, "Engine Arguments"); the backend passes model.json to AsyncEngineArgs.
VLLM_ENGINE_ARGS: dict[str, type | tuple[type, ...]] = {
    "model": str, "tokenizer": str, "dtype": str, "max_model_len": int,
    "gpu_memory_utilization": float, "tensor_parallel_size": int,
    "pipeline_parallel_size": int, "enable_prefix_caching": bool, "max_num_seqs": int,
    "max_num_batched_tokens": int, "disable_log_stats": bool, "enforce_eager": bool,
    "trust_remote_code": bool, "quantization": str, "kv_cache_dtype": str, "seed": int,
    "served_model_name": (str, list), "download_dir": str, "enable_chunked_prefill": bool,
}  # fmt: skip
# The fields of vLLM's SamplingParams the gateway may set in `sampling_parameters`
# (guided_decoding: the Triton backend's name, mapped to structured_outputs).
VLLM_SAMPLING = {"max_tokens", "temperature", "top_p", "seed", "stop", "guided_decoding"}
# The tensors of TensorRT-LLM's step models, as its own ensemble names them
# (triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt).
TENSORRTLLM_STEP_TENSORS = {
    "preprocessing": {
        "QUERY", "DECODER_QUERY", "REQUEST_OUTPUT_LEN", "BAD_WORDS_DICT", "STOP_WORDS_DICT",
        "EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS", "END_ID", "PAD_ID",
        "PROMPT_TABLE_EXTRA_ID", "REQUEST_INPUT_LEN", "INPUT_ID", "REQUEST_DECODER_INPUT_LEN",
        "DECODER_INPUT_ID", "STOP_WORDS_IDS", "BAD_WORDS_IDS", "EMBEDDING_BIAS",
        "OUT_END_ID", "OUT_PAD_ID", "OUT_PROMPT_TABLE_EXTRA_IDS",
    },
    "tensorrt_llm": {
        "input_ids", "decoder_input_ids", "input_lengths", "decoder_input_lengths",
        "exclude_input_in_output", "request_output_len", "end_id", "pad_id",
        "embedding_bias", "runtime_top_k", "runtime_top_p", "temperature", "len_penalty",
        "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "seed",
        "return_log_probs", "return_context_logits", "return_generation_logits",
        "return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens",
        "num_return_sequences", "beam_width", "streaming", "prompt_embedding_table",
        "prompt_vocab_size", "stop_words_list", "bad_words_list", "prompt_table_extra_ids",
        "lora_task_id", "lora_weights", "lora_config", "guided_decoding_guide_type",
        "guided_decoding_guide", "output_ids", "sequence_length", "cum_log_probs",
        "output_log_probs", "context_logits", "generation_logits", "batch_index",
        "sequence_index", "num_input_tokens", "num_output_tokens",
    },
    "postprocessing": {"TOKENS_BATCH", "SEQUENCE_LENGTH", "OUTPUT"},
}  # fmt: skip


def model_config(path: Path) -> model_config_pb2.ModelConfig:
    """A config.pbtxt as tritonserver reads it."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def sent_keys(interface: TritonInterface, stream: bool) -> dict[str, Any]:
    """What the gateway sends a model of `interface` for a chat that sets everything."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    call = UpstreamCall(
        kind=RequestKind.CHAT,
        upstream_model="m",
        prompt="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        messages=(),
        params=SamplingParams(64, temperature=0.5, top_p=0.9, stop=("a", "b"), seed=7),
        prompt_estimate=9,
        options=ChatOptions(
            response_format=ResponseFormat("json_schema", "s", schema), top_logprobs=0
        ),
    )
    body: dict[str, Any] = orjson.loads(generate_body[interface](call, stream))
    return body


def test_every_config_is_read_by_tritons_own_model_config() -> None:
    configs = sorted(TRITON.rglob("config.pbtxt"))
    assert [c.relative_to(TRITON).as_posix() for c in configs] == [
        "tensorrtllm/ensemble/config.pbtxt",
        "vllm/qwen2.5-7b-instruct/config.pbtxt",
    ]
    for path in configs:
        config = model_config(path)
        assert config.name == path.parent.name
        assert (path.parent / "1").is_dir()  # Triton loads version 1


def test_a_config_with_a_wrong_field_is_refused_by_the_same_reader() -> None:
    # The reader is strict, as tritonserver's: a misspelt field does not pass silently.
    with pytest.raises(text_format.ParseError, match="max_batchsize"):
        text_format.Parse('name: "x"\nmax_batchsize: 0\n', model_config_pb2.ModelConfig())


def test_the_vllm_model_is_what_its_backend_requires() -> None:
    config = model_config(VLLM_MODEL / "config.pbtxt")
    assert config.backend == "vllm"
    # The backend asserts a decoupled model, and batches itself.
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 0
    [group] = config.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_MODEL
    assert {i.name for i in config.input} <= VLLM_BACKEND_INPUTS
    engine_args = json.loads((VLLM_MODEL / "1" / "model.json").read_text())
    assert engine_args["model"] == "Qwen/Qwen2.5-7B-Instruct"
    for key, value in engine_args.items():
        assert key in VLLM_ENGINE_ARGS, f"model.json: {key} is not a vLLM engine argument"
        assert isinstance(value, VLLM_ENGINE_ARGS[key]), f"model.json: {key}={value!r}"
    # What vLLM reports of the engine is what the gateway scrapes: its stats stay on.
    assert engine_args["disable_log_stats"] is False


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_sends_the_vllm_model_only_inputs_it_declares(stream: bool) -> None:
    body = sent_keys(TritonInterface.VLLM, stream)
    declared = {i.name for i in model_config(VLLM_MODEL / "config.pbtxt").input}
    assert set(body) <= declared
    assert body["exclude_input_in_output"] is True and body["stream"] is stream
    sampling = json.loads(body["sampling_parameters"])
    assert set(sampling) <= VLLM_SAMPLING
    assert sampling["stop"] == ["a", "b"] and sampling["max_tokens"] == 64
    assert sampling["guided_decoding"] == {
        "json": {"type": "object", "properties": {"a": {"type": "string"}}}
    }


def test_the_ensemble_is_whole() -> None:
    config = model_config(ENSEMBLE / "config.pbtxt")
    assert config.platform == "ensemble"
    available = {i.name for i in config.input}
    steps = config.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    for step in steps:
        tensors = TENSORRTLLM_STEP_TENSORS[step.model_name]
        assert set(step.input_map) <= tensors, step.model_name
        assert set(step.output_map) <= tensors, step.model_name
        unknown = set(step.input_map.values()) - available
        assert not unknown, f"{step.model_name} reads {unknown}, which nothing makes"
        available |= set(step.output_map.values())
    assert {o.name for o in config.output} <= available


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_sends_the_ensemble_only_inputs_it_declares(stream: bool) -> None:
    body = sent_keys(TritonInterface.TENSORRTLLM, stream)
    config = model_config(ENSEMBLE / "config.pbtxt")
    declared = {i.name for i in config.input}
    assert set(body) <= declared
    required = {i.name for i in config.input if not i.optional}
    assert required <= set(body)
    assert body["stop_words"] == ["a", "b"] and body["seed"] == 7


def test_fill_template_gives_each_step_model_what_the_ensemble_needs() -> None:
    lines = (TRITON / "tensorrtllm" / "fill_template.txt").read_text().splitlines()
    values = {
        model: dict(pair.split(":", 1) for pair in settings.split(","))
        for model, settings in (line.split(" ", 1) for line in lines if not line.startswith("#"))
    }
    assert set(values) == {"preprocessing", "tensorrt_llm", "postprocessing"}
    batch = str(model_config(ENSEMBLE / "config.pbtxt").max_batch_size)
    assert {v["triton_max_batch_size"] for v in values.values()} == {batch}
    trtllm = values["tensorrt_llm"]
    # Streaming needs the decoupled mode; the in-flight batcher is what it is named for.
    assert trtllm["decoupled_mode"] == "True"
    assert trtllm["batching_strategy"] == "inflight_fused_batching"
    # The gateway renders the template: the tokenizer must not add a BOS of its own.
    assert values["preprocessing"]["add_special_tokens"] == "False"


def test_the_gateway_config_passes_check_config_with_the_models_tokenizer_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "triton"
    copy.mkdir()
    for name in ("gateway.yaml", "tenants.yaml"):
        shutil.copy(TRITON / name, copy / name)
    monkeypatch.setenv("QWEN_TENANT_KEY", "sk-qwen-test-key")
    problems = check_config(str(copy / "gateway.yaml"))
    assert len(problems) == 2 and all("cannot read" in p for p in problems), problems
    (copy / "qwen2.5-7b-instruct").mkdir()
    shutil.copy(QWEN_TOKENIZER, copy / "qwen2.5-7b-instruct" / "tokenizer_config.json")
    assert check_config(str(copy / "gateway.yaml")) == []


def test_a_negative_seed_reaches_the_ensembles_unsigned_input_as_its_64_bits() -> None:
    # TensorRT-LLM's `seed` is UINT64: -1 made Triton answer 500, which ejected the
    # replica for every tenant (issue 42's hostile review).
    call = UpstreamCall(
        kind=RequestKind.CHAT, upstream_model="ensemble", prompt="x", messages=(),
        params=SamplingParams(8, seed=-1), prompt_estimate=1,
    )  # fmt: skip
    body = orjson.loads(generate_body[TritonInterface.TENSORRTLLM](call, False))
    assert body["seed"] == 2**64 - 1
    seed = next(i for i in model_config(ENSEMBLE / "config.pbtxt").input if i.name == "seed")
    assert seed.data_type == model_config_pb2.TYPE_UINT64
