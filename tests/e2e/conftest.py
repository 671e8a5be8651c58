"""Real Triton servers (triton-sim) and a gateway process in front of them."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from gateway_tools.dev.processes import free_port, stop
from gateway_tools.dev.sim.repository import ModelProfile
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.stack import KEYS, Gateway, model, start_gateway

# Fast simulated models: the tests check behaviour, not speed.
LARGE = "llm-large=4"
SMALL = "llm-small=1"
# Slow enough that a request is surely still running while a test looks at it.
SLOW = "llm-slow=40"
EMBED = "embed-small"


def start_sim(models: str) -> TritonSim:
    """A Triton server of the simulated models `models` names (`llm-small=1,...`)."""
    return start_sim_profiles(models)


def start_sim_profiles(
    models: str | Sequence[ModelProfile], trace_url: str | None = None
) -> TritonSim:
    """A Triton server of these simulated models, ready (sending its spans to
    `trace_url`, when given)."""
    sim = TritonSim(free_port(span=3, start=ports.SIMS), models, trace_url)
    sim.start()
    try:
        sim.wait_ready(timeout=90)
    except Exception:
        sim.stop()
        raise
    return sim


@contextmanager
def two_sims(models_a: str, models_b: str) -> Iterator[tuple[TritonSim, TritonSim]]:
    """Two Triton servers, both stopped at the end whatever happens."""
    a = start_sim(models_a)
    try:
        b = start_sim(models_b)
    except Exception:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


@pytest.fixture(scope="session")
def sims() -> Iterator[tuple[TritonSim, TritonSim]]:
    """Server A serves llm-large, llm-small, llm-slow and embed-small, server B another
    llm-large and embed-small."""
    with two_sims(f"{LARGE},{SMALL},{SLOW},{EMBED}", f"{LARGE},{EMBED}") as pair:
        yield pair


@pytest.fixture(scope="session")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """llm-large over Triton HTTP (2 replicas), llm-small over gRPC, `relay` over the
    OpenAI backend (the gateway relaying llm-small to itself)."""
    a, b = sims
    models = {
        "llm-large": model("triton_http", [a.http_url, b.http_url], fallback=["llm-small"]),
        "llm-small": model("triton_grpc", [a.grpc_target]),
        "relay": model(
            "openai", ["${SELF_URL}"], upstream_model="llm-small", api_key="${RELAY_KEY}"
        ),
    }
    gw = start_gateway(
        tmp_path_factory.mktemp("gateway"),
        models,
        redis_url,
        gateway={"server": {"max_body_bytes": 8192}},
        env={"RELAY_KEY": KEYS["acme"]},
    )
    try:
        yield gw
    finally:
        stop(gw.process)


@pytest.fixture(scope="session")
def acme(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)


@pytest.fixture(scope="session")
def globex(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=KEYS["globex"], max_retries=0)


@contextmanager
def two_sims_and_gateway(
    models_spec: str,
    build_models: Callable[[TritonSim, TritonSim], dict[str, Any]],
    redis_url: str,
    tmp_path: Path,
    tenants: dict[str, Any],
) -> Iterator[tuple[Gateway, TritonSim, TritonSim]]:
    """Two Triton servers of their own (tests that kill or load one) and a gateway."""
    first = start_sim(models_spec)
    second: TritonSim | None = None
    gateway: Gateway | None = None
    try:
        second = start_sim(models_spec)
        models = build_models(first, second)
        gateway = start_gateway(tmp_path, models, redis_url, tenants=tenants)
        yield gateway, first, second
    finally:
        if gateway is not None:
            stop(gateway.process)
        if second is not None:
            second.stop()
        first.stop()


def installed(script: str) -> Path:
    """What one of scripts/ installs (pinned, from its registry, cached between runs):
    the directory the script prints."""
    run = subprocess.run(
        [str(Path(__file__).resolve().parents[2] / "scripts" / script)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return Path(run.stdout.strip())


@pytest.fixture(scope="session")
def tools_bin() -> Path:
    """The pinned coding tools' commands (installed once, then from the cache)."""
    return installed("coding-tools.sh")


# The scripted agent of the coding tools' runs (evals/replay/agent.json).
AGENT = "coder-agent"


@pytest.fixture(scope="module")
def agent_sim() -> Iterator[TritonSim]:
    """A Triton server of the scripted agent the coding tools run against."""
    from gateway_tools.dev.replay import REPLAY_DIR

    sim = start_sim(f"{AGENT}=@{REPLAY_DIR / 'agent.json'}")
    try:
        yield sim
    finally:
        sim.stop()


def agent_model(sim: TritonSim, **extra: Any) -> dict[str, Any]:
    """The scripted agent as a gateway.yaml model: chatml, hermes tool calls, a context
    as long as a coding tool's prompts."""
    return model(
        "triton_http",
        [sim.http_url],
        prompt_template="chatml",
        capabilities={"tools": True, "tool_parser": "hermes"},
        max_tokens_default=1024,
        max_tokens_limit=4096,
        context_length=262_144,
        timeouts={"first_token_s": 10, "first_token_per_prompt_token_s": 0.001},
        **extra,
    )
