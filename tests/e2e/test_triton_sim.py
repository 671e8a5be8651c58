"""End-to-end tests of `gateway_tools.dev.sim`: a real tritonserver serving the simulated LLMs.

One server (two fast models) is shared by the behaviour tests; the shutdown tests start
their own. Expected texts come from `generate_pieces`, the function the model runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.grpc._infer_result import InferResult

from gateway_tools.dev.sim import TritonSim, TritonSimError, parse_models
from gateway_tools.dev.sim.model_template import generate_pieces, natural_length
from gateway_tools.dev.sim.server import SHM_DIR, processes_mentioning

MODEL = "fast"  # token_delay 2 ms
PROMPT = "Tell me about the weather in Lisbon."


def test_parse_models() -> None:
    large, small, other, fast = parse_models(" llm-large, llm-small,other,fast=2,")
    assert (large.token_delay, large.prefill_per_char) == (0.04, 0.0004)
    assert (small.token_delay, small.prefill_per_char) == (0.008, 0.00005)
    assert (other.name, other.token_delay) == ("other", small.token_delay)
    assert (fast.name, fast.token_delay, fast.prefill_per_char) == ("fast", 0.002, 0.00002)
    for bad in ("", "a,a", "a=x", "a=-1", "bad/name", "a:sglang", "a:vllm,a"):
        with pytest.raises(ValueError):
            parse_models(bad)
    # Another backend's inputs: `name:vllm`, `name:tensorrtllm`, with a delay too.
    vllm, trt = parse_models("qwen:vllm=2,trt:tensorrtllm")
    assert (vllm.name, vllm.interface, vllm.token_delay) == ("qwen", "vllm", 0.002)
    assert (trt.name, trt.interface, small.interface) == ("trt", "tensorrtllm", "generic")


def test_start_refuses_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        sim = TritonSim(busy.getsockname()[1] - 1, "fast=1")  # gRPC port taken
        with pytest.raises(TritonSimError, match="in use"):
            sim.start()
        assert sim.workdir is None and sim.pid is None


def free_base_port() -> int:
    """A port P with P, P+1 and P+2 free, below the ephemeral range."""
    for _ in range(100):
        base = random.randrange(20000, 32000)
        try:
            for port in (base, base + 1, base + 2):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports")


@pytest.fixture(scope="module")
def sim() -> Iterator[TritonSim]:
    with TritonSim(free_base_port(), "llm-small,fast=2") as server:
        yield server


@pytest.fixture(scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def expected(prompt: str, **kwargs: Any) -> list[str]:
    return generate_pieces(prompt.encode(), **kwargs)


async def generate(
    http: aiohttp.ClientSession, sim: TritonSim, body: dict[str, Any], model: str = MODEL
) -> tuple[int, dict[str, Any]]:
    url = f"{sim.http_url}/v2/models/{model}/generate"
    async with http.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)


async def generate_stream(
    http: aiohttp.ClientSession, sim: TritonSim, body: dict[str, Any]
) -> list[dict[str, Any]]:
    url = f"{sim.http_url}/v2/models/{MODEL}/generate_stream"
    events = []
    async with http.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        async for line in response.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: ") :]))
    return events


async def test_generate_is_deterministic(sim: TritonSim, http: aiohttp.ClientSession) -> None:
    status, first = await generate(http, sim, {"text_input": PROMPT})
    _, again = await generate(http, sim, {"text_input": PROMPT})
    _, other = await generate(http, sim, {"text_input": PROMPT + "?"})
    assert status == 200
    assert set(first) == {
        "model_name",
        "model_version",
        "text_output",
        "num_input_tokens",
        "num_output_tokens",
        "num_cached_tokens",
    }
    words = expected(PROMPT)
    assert first["text_output"] == "".join(words) == again["text_output"]
    assert other["text_output"] != first["text_output"]
    assert first["num_input_tokens"] == math.ceil(len(PROMPT.encode()) / 4)
    assert first["num_output_tokens"] == len(words) == min(natural_length(PROMPT.encode()), 16)
    assert all(w.endswith(" ") and " " not in w[:-1] for w in words)


async def test_other_model_serves_the_same_text(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    status, body = await generate(http, sim, {"text_input": PROMPT}, model="llm-small")
    assert status == 200
    assert body["model_name"] == "llm-small"
    assert body["text_output"] == "".join(expected(PROMPT))


async def test_max_tokens_and_natural_length(sim: TritonSim, http: aiohttp.ClientSession) -> None:
    _, three = await generate(http, sim, {"text_input": PROMPT, "max_tokens": 3})
    assert three["num_output_tokens"] == 3
    assert three["text_output"] == "".join(expected(PROMPT, max_tokens=3))
    _, long = await generate(http, sim, {"text_input": PROMPT, "max_tokens": 1000})
    assert long["num_output_tokens"] == natural_length(PROMPT.encode())
    assert long["text_output"].startswith(three["text_output"])


async def test_sampling_parameters_are_accepted(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    body = {"text_input": PROMPT, "temperature": 0.7, "top_p": 0.9}
    status, plain = await generate(http, sim, body)
    assert status == 200
    assert plain["text_output"] == "".join(expected(PROMPT))
    _, seeded = await generate(http, sim, {**body, "seed": 42})
    assert seeded["text_output"] == "".join(expected(PROMPT, seed=42))
    assert seeded["text_output"] != plain["text_output"]


async def test_generate_stream_one_event_per_token(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    events = await generate_stream(http, sim, {"text_input": PROMPT, "max_tokens": 12})
    _, whole = await generate(http, sim, {"text_input": PROMPT, "max_tokens": 12})
    assert [e["text_output"] for e in events] == expected(PROMPT, max_tokens=12)
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
    assert all(e["num_output_tokens"] == 1 for e in events)
    assert {e["num_input_tokens"] for e in events} == {whole["num_input_tokens"]}


async def test_stop_string_cuts_the_text(sim: TritonSim, http: aiohttp.ClientSession) -> None:
    words = expected(PROMPT, max_tokens=64)
    # A stop string that begins inside the fourth word: the answer ends mid-word.
    stop = words[3][1:] + words[4]
    cut = "".join(words)[: len("".join(words[:3])) + 1]
    body = {"text_input": PROMPT, "max_tokens": 64, "stop": json.dumps(["nope", stop])}
    _, whole = await generate(http, sim, body)
    assert whole["text_output"] == cut
    assert whole["num_output_tokens"] == 4
    events = await generate_stream(http, sim, body)
    assert "".join(e["text_output"] for e in events) == cut
    assert len(events) == 4


async def test_stop_at_the_start_still_reports_usage(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    first_word = expected(PROMPT)[0]
    events = await generate_stream(http, sim, {"text_input": PROMPT, "stop": first_word})
    assert [(e["text_output"], e["num_output_tokens"]) for e in events] == [("", 0)]


async def test_missing_or_empty_text_input_is_an_error(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    for body in ({"max_tokens": 4}, {"text_input": ""}):
        status, reply = await generate(http, sim, body)
        assert status == 400
        assert "text_input" in reply["error"]
    # The model survives: the next request works.
    status, _ = await generate(http, sim, {"text_input": PROMPT})
    assert status == 200


def grpc_request(request_id: str, prompt: bytes, *, stream: bool = True) -> Any:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(prompt)
    flag = request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(stream)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.parameters["temperature"].double_param = 0.5
    return request


async def test_grpc_stream_infer(sim: TritonSim) -> None:
    requests = {
        "tokens": grpc_request("tokens", PROMPT.encode()),
        "whole": grpc_request("whole", PROMPT.encode(), stream=False),
        "empty": grpc_request("empty", b""),
    }
    outputs: dict[str, list[tuple[str, int]]] = {key: [] for key in requests}
    finals: dict[str, bool] = {}
    errors: dict[str, str] = {}

    all_final = asyncio.Event()

    async def send() -> AsyncIterator[Any]:
        for request in requests.values():
            yield request
        await all_final.wait()  # closing the request stream early would end the call

    async with grpc.aio.insecure_channel(sim.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        async for message in stub.ModelStreamInfer(send()):
            response = message.infer_response
            assert response.id not in finals, "response after the final one"
            if message.error_message:
                errors[response.id] = message.error_message
            elif response.outputs:
                result = InferResult(response)
                text = result.as_numpy("text_output")[0].decode()
                outputs[response.id].append((text, int(result.as_numpy("num_output_tokens")[0])))
                assert result.as_numpy("num_input_tokens")[0] == math.ceil(len(PROMPT) / 4)
            if response.parameters["triton_final_response"].bool_param:
                finals[response.id] = True
                if len(finals) == len(requests):
                    all_final.set()
                    break
    words = expected(PROMPT)
    assert outputs["tokens"] == [(w, 1) for w in words]
    assert outputs["whole"] == [("".join(words), len(words))]
    assert "text_input" in errors["empty"]


def shm_entries(prefix: str) -> list[str]:
    return [p.name for p in SHM_DIR.glob(f"{prefix}*")]


def test_kill_restart_and_stop_leave_nothing_behind() -> None:
    sim = TritonSim(free_base_port(), "fast=1")
    workdirs = []
    with sim:
        assert sim.workdir is not None
        workdirs.append(str(sim.workdir))
        assert len(processes_mentioning(workdirs[0])) == 2  # tritonserver + one stub
        assert shm_entries(sim.shm_prefix), "the stub's shm regions use our prefix"
        sim.kill()  # a crashed replica
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{sim.http_url}/v2/health/live", timeout=5)
        sim.start()  # ... that comes back on the same ports
        sim.wait_ready()
        assert sim.workdir is not None
        workdirs.append(str(sim.workdir))
        with urllib.request.urlopen(f"{sim.http_url}/v2/models/fast/ready", timeout=5) as r:
            assert r.status == 200
    for workdir in workdirs:
        assert processes_mentioning(workdir) == []
        assert not Path(workdir).exists()
    assert shm_entries(sim.shm_prefix) == []


def test_run_triton_sim_stops_on_sigint_even_if_ignored() -> None:
    port = free_base_port()
    code = (
        "import sys; from gateway_tools.dev.sim import run_triton_sim; "
        f"sys.exit(run_triton_sim({port}, 'fast=1'))"
    )
    # Like `gateway triton-sim &` from a script: the child starts with SIGINT ignored.
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("triton-sim ready:"), line
        assert f"http=http://127.0.0.1:{port}" in line
        assert f"grpc=127.0.0.1:{port + 1}" in line
        server_pids = processes_mentioning(f"--http-port={port}")
        assert len(server_pids) == 1
        args = Path(f"/proc/{server_pids[0]}/cmdline").read_bytes().decode().split("\0")
        workdir = str(
            Path(next(a for a in args if a.startswith("--model-repository="))[19:]).parent
        )
        prefix = next(a for a in args if "shm-region-prefix-name=" in a).split("=")[-1]
        assert shm_entries(prefix)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert processes_mentioning(workdir) == []
    assert shm_entries(prefix) == []


async def test_the_prefix_cache_serves_a_repeated_prefix_and_reports_it(
    sim: TritonSim, http: aiohttp.ClientSession
) -> None:
    """Issue 17's first piece: a prompt's full 16-token blocks are cached per replica;
    the next prompt on the same prefix reports them cached, and Triton's custom metrics
    count the lookups, the hits and the cache's usage."""
    system = f"You are the assistant of tenant {random.random()}. " * 12  # own prefix
    _, first = await generate(http, sim, {"text_input": system + "First question?"})
    _, second = await generate(http, sim, {"text_input": system + "Second, longer question?"})
    block_tokens = 16
    prefix_blocks = len(system.encode()) // (4 * block_tokens)
    assert first["num_cached_tokens"] == 0
    assert second["num_cached_tokens"] == prefix_blocks * block_tokens
    async with http.get(sim.metrics_url) as response:
        exposition = await response.text()
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("sim_prefix_cache") and f'model="{MODEL}"' in line
    }
    assert values["sim_prefix_cache_hits_total"] >= prefix_blocks * block_tokens
    assert values["sim_prefix_cache_queries_total"] > values["sim_prefix_cache_hits_total"]
    assert 0 < values["sim_prefix_cache_usage"] < 1
