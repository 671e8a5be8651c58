"""The OpenAI API through the gateway, driven by the official `openai` SDK."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import httpx
import openai
import orjson
import pytest
from openai import OpenAI

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import KEYS, Gateway, model, start_gateway

HELLO = [{"role": "user", "content": "Say hello to the gateway tests"}]


def stream_text(client: OpenAI, model: str, **kwargs: object) -> tuple[str, list[object]]:
    chunks = list(
        client.chat.completions.create(model=model, messages=HELLO, stream=True, **kwargs)  # type: ignore[call-overload]
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_chat_completion_has_text_usage_and_model(acme: OpenAI, model: str) -> None:
    response = acme.chat.completions.create(model=model, messages=HELLO, max_tokens=5)
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert response.model == model
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 5
    assert choice.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.completion_tokens == 5
    assert response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + 5


def test_every_backend_gives_the_same_text_for_the_same_prompt(acme: OpenAI) -> None:
    # The simulated models derive their text from the prompt alone, so the three backends
    # (Triton HTTP, Triton gRPC, OpenAI relay) must agree exactly.
    texts = {
        model: acme.chat.completions.create(model=model, messages=HELLO, max_tokens=7)
        .choices[0]
        .message.content
        for model in ("llm-large", "llm-small", "relay")
    }
    assert len(set(texts.values())) == 1, texts


@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_streamed_chat_matches_the_whole_response(acme: OpenAI, model: str) -> None:
    whole = acme.chat.completions.create(model=model, messages=HELLO, max_tokens=6)
    text, chunks = stream_text(acme, model, max_tokens=6, stream_options={"include_usage": True})
    assert text == whole.choices[0].message.content
    assert len(chunks) >= 6 + 2  # one per token, the finish chunk, the usage chunk
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length" and not any(finish[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 6


def test_stream_without_include_usage_sends_no_usage(acme: OpenAI) -> None:
    _, chunks = stream_text(acme, "llm-small", max_tokens=3)
    assert all(getattr(c, "usage", None) is None for c in chunks)


@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_text_completion_streamed_and_not(acme: OpenAI, model: str) -> None:
    whole = acme.completions.create(model=model, prompt="Once upon a time", max_tokens=4)
    assert whole.object == "text_completion"
    assert len(whole.choices[0].text.split()) == 4
    assert whole.usage is not None and whole.usage.completion_tokens == 4
    chunks = list(
        acme.completions.create(model=model, prompt="Once upon a time", max_tokens=4, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_stop_sequence_reaches_the_model(acme: OpenAI, model: str) -> None:
    words = acme.chat.completions.create(model=model, messages=HELLO, max_tokens=8)
    words_list = words.choices[0].message.content.split()
    stop_word = words_list[3]
    cut = acme.chat.completions.create(model=model, messages=HELLO, max_tokens=8, stop=[stop_word])
    text = cut.choices[0].message.content
    assert stop_word not in text.split()
    assert words.choices[0].message.content.startswith(text)
    assert cut.choices[0].finish_reason == "stop"


def test_models_lists_only_the_tenants_models(acme: OpenAI, globex: OpenAI) -> None:
    assert sorted(m.id for m in acme.models.list()) == ["llm-large", "llm-small", "relay"]
    assert [m.id for m in globex.models.list()] == ["llm-small"]


def test_models_retrieve_answers_only_for_the_tenants_models(acme: OpenAI, globex: OpenAI) -> None:
    model = acme.models.retrieve("llm-large")
    assert (model.id, model.object, model.owned_by) == ("llm-large", "model", "gateway")
    # Another tenant's model is a 404, as an unknown one: its existence is not told.
    for client, name in ((globex, "llm-large"), (acme, "no-such-model")):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(name)
        assert caught.value.code == "model_not_found"
        assert f"`{name}` does not exist or you do not have access to it" in caught.value.message


def test_an_unknown_path_names_itself(gateway: Gateway) -> None:
    import urllib.error
    import urllib.request

    def error_of(path: str) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(
            f"{gateway.url}{path}", headers={"Authorization": f"Bearer {KEYS['acme']}"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        return caught.value.code, orjson.loads(caught.value.read())["error"]

    status, error = error_of("/v1/embedding")
    assert (status, error["code"]) == (404, "unknown_url")
    assert error["message"] == "Invalid URL (GET /v1/embedding)."
    status, error = error_of("/v1/chat/completions")
    assert (status, error["message"]) == (405, "Method not allowed (GET /v1/chat/completions).")


def test_unknown_key_is_401(gateway: Gateway) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="llm-small", messages=HELLO)
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    assert "sk-not-a-key" not in str(caught.value)


def test_model_not_allowed_for_tenant_is_403(globex: OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        globex.chat.completions.create(model="llm-large", messages=HELLO)
    assert caught.value.code == "model_not_allowed"


def test_unknown_model_is_404(acme: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        acme.chat.completions.create(model="gpt-unknown", messages=HELLO)
    assert caught.value.code == "model_not_found"
    assert "gpt-unknown" in caught.value.message


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"messages": HELLO, "temperature": 3}, "temperature"),
        ({"messages": HELLO, "n": 17}, "n"),
        ({"messages": HELLO, "max_tokens": True}, "max_tokens"),  # over the limit: clamped
    ],
)
def test_invalid_field_is_400_naming_it(
    acme: OpenAI, kwargs: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        acme.chat.completions.create(model="llm-small", **kwargs)  # type: ignore[call-overload]
    assert caught.value.status_code == 400
    assert caught.value.param == param


async def test_bad_json_is_400(gateway: Gateway) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.base_url}/chat/completions",
            data=b'{"model": "llm-small", "messages": [',
            headers={"authorization": f"Bearer {KEYS['acme']}"},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in body["error"]["message"]


def test_oversized_body_is_413(acme: OpenAI) -> None:
    # The test gateway allows 8 KiB bodies.
    huge = [{"role": "user", "content": "x" * 10_000}]
    with pytest.raises(openai.APIStatusError) as caught:
        acme.chat.completions.create(model="llm-small", messages=huge)
    assert caught.value.status_code == 413
    assert caught.value.code == "request_too_large"


def test_a_413_closes_the_connection_and_says_so(gateway: Gateway) -> None:
    """The rest of a refused body is not read, so the connection cannot carry another
    request: the 413 says `connection: close`, and a keep-alive client's next request
    goes out on a new connection (it met a closed one one time in five)."""
    url = f"{gateway.base_url}/chat/completions"
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    small = {"model": "llm-small", "messages": [{"role": "user", "content": "Hi"}]}
    huge = {**small, "messages": [{"role": "user", "content": "x" * 2_000_000}]}
    with httpx.Client(headers=headers, timeout=30) as client:
        for _ in range(5):
            refused = client.post(url, json=huge)
            assert refused.status_code == 413
            assert refused.headers["connection"] == "close"
            assert client.post(url, json=small).status_code == 200


async def test_liveness_and_readiness(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/livez", "/healthz"):
            async with session.get(f"{gateway.url}{path}") as alive:
                assert (alive.status, await alive.json()) == (200, {"status": "ok"})
        async with session.get(f"{gateway.url}/readyz") as ready:
            body = await ready.json()
    assert ready.status == 200
    one, two = ({"ready": True, "replicas": n, "healthy": n} for n in (1, 2))
    assert body == {
        "ready": True,
        "status": "ok",
        "redis": {"up": True, "on_error": "local"},
        "models": {"llm-large": two, "llm-small": one, "relay": one},
    }


async def test_unknown_path_gets_an_openai_shaped_404(gateway: Gateway) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.base_url}/engines") as response,
    ):
        body = await response.json()
    assert response.status == 404
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_a_trailing_slash_is_a_404_not_a_redirect_built_from_host(
    gateway: Gateway,
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.base_url}/chat/completions/",
            headers={"Host": "evil.example", "Authorization": f"Bearer {KEYS['acme']}"},
            json={"model": "llm-small", "messages": [{"role": "user", "content": "hi"}]},
            allow_redirects=False,
        ) as response,
    ):
        body = await response.json()
    assert response.status == 404
    assert "location" not in response.headers
    assert set(body["error"]) == {"message", "type", "param", "code"}


def test_metrics_and_the_request_log_show_the_request_without_key_or_prompt(
    acme: OpenAI, gateway: Gateway
) -> None:
    prompt = "a very private prompt about the quarterly numbers"
    response = acme.chat.completions.create(
        model="llm-large", messages=[{"role": "user", "content": prompt}], max_tokens=3
    )
    # Counted and logged just after the response: wait for its log line first.
    record = gateway.access_record(response.id)
    assert record["tenant"] == "acme" and record["status"] == 200
    exposition = fetch_text(f"{gateway.ops_url}/metrics")
    series = (
        'gateway_requests_total{endpoint="chat",model="llm-large",served_model="llm-large",'
        'status="200",tenant="acme"}'
    )
    assert series in exposition
    assert 'gateway_tokens_total{kind="completion",model="llm-large",tenant="acme"}' in exposition
    assert 'gateway_replica_tokens_total{model="llm-large",replica="' in exposition
    assert 'gateway_replica_healthy{model="llm-small",replica="' in exposition
    assert "gateway_config_info{version=" in exposition
    # Triton's own queue, scraped from each replica and re-exported.
    assert 'gateway_triton_pending_requests{model="llm-large",replica="' in exposition
    assert 'gateway_triton_queue_duration_seconds_total{model="llm-large",replica="' in exposition
    assert sum(response.id in line for line in gateway.log.splitlines()) == 1
    assert record["completion_tokens"] == 3
    assert prompt not in gateway.log
    assert KEYS["acme"] not in gateway.log


def fetch_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _replica_tokens(gateway: Gateway, model: str) -> float:
    prefix = f'gateway_replica_tokens_total{{model="{model}",'
    return sum(
        float(line.split()[-1])
        for line in fetch_text(f"{gateway.ops_url}/metrics").splitlines()
        if line.startswith(prefix)
    )


def test_replica_throughput_counts_the_tokens_a_stream_produced(
    acme: OpenAI, gateway: Gateway
) -> None:
    """Counted in tokens (the upstream's usage), not in chunks: an OpenAI upstream's
    stream ends with chunks that carry no token."""
    before = _replica_tokens(gateway, "relay")
    chunks = list(
        acme.chat.completions.create(
            model="relay",
            messages=[{"role": "user", "content": "count my tokens"}],
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 9
    assert _replica_tokens(gateway, "relay") - before == usage.completion_tokens


@pytest.mark.parametrize(
    ("who", "asked", "served_as"),
    [("globex", "online", "batch"), ("acme", "batch", "batch"), ("acme", None, "online")],
)
def test_a_request_may_lower_its_priority_but_not_raise_it(
    acme: OpenAI, globex: OpenAI, gateway: Gateway, who: str, asked: str | None, served_as: str
) -> None:
    client = {"acme": acme, "globex": globex}[who]
    headers = {} if asked is None else {"x-priority": asked}
    response = client.chat.completions.create(
        model="llm-small", messages=HELLO, max_tokens=1, extra_headers=headers
    )
    assert gateway.access_record(response.id)["priority"] == served_as


def test_an_unknown_priority_is_400(acme: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        acme.chat.completions.create(
            model="llm-small", messages=HELLO, extra_headers={"x-priority": "urgent"}
        )
    assert refused.value.body["param"] == "x-priority"  # type: ignore[index]


def test_prompts_are_logged_only_when_configured_and_then_redacted(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> None:
    """Off by default (see above); `server.log_prompts: true` logs them, secrets scrubbed."""
    models = {"llm-small": model("triton_grpc", [sims[0].grpc_target])}
    gw = start_gateway(tmp_path, models, redis_url, gateway={"server": {"log_prompts": True}})
    try:
        client = OpenAI(base_url=gw.base_url, api_key=KEYS["acme"], max_retries=0)
        content = "summarise the memo; the db is postgres://app:hunter2@db.internal/prod"
        response = client.chat.completions.create(
            model="llm-small", messages=[{"role": "user", "content": content}], max_tokens=2
        )
        record = gw.access_record(response.id)
    finally:
        stop(gw.process)
    assert record["prompt"] == (
        "user: summarise the memo; the db is postgres://app:[REDACTED]@db.internal/prod"
    )
    assert "hunter2" not in gw.log


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["llm-large", "llm-small", "relay"])
def test_an_input_the_model_refuses_is_a_400_on_every_backend(
    acme: OpenAI, model: str, stream: bool
) -> None:
    """Triton HTTP, Triton gRPC and an OpenAI upstream alike: the client's error, not the
    backend's (no 502, no fallback to another model, no blame on the replica)."""
    with pytest.raises(openai.BadRequestError) as caught:
        answer = acme.completions.create(model=model, prompt="", max_tokens=2, stream=stream)
        if stream:
            list(answer)
    assert "text_input is required and must not be empty" in caught.value.message
