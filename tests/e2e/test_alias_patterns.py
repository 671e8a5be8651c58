"""Coding tools' default model names routed by alias patterns, with the real `anthropic`
and `openai` SDKs as clients: Claude Code's `claude-opus-4-8[1m]` (brackets and all) and
its `claude-haiku-*` side calls, Codex CLI's `gpt-5.6-codex`, a tenant's own map, and an
unknown name answered in each wire's error shape."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, running_gateway, tenant

ASK: Any = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    models = {
        "large": model("triton_grpc", [a.grpc_target], upstream_model="llm-small",
                       aliases=["claude-*", "gpt-*", "codex-*"]),
        "small": model("triton_grpc", [a.grpc_target], upstream_model="llm-small",
                       aliases=["claude-haiku-*"]),
    }  # fmt: skip
    tenants = {
        "acme": tenant("acme", ["*"]),
        "globex": tenant("globex", ["small"], aliases={"claude-*": "small", "gpt-*": "small"}),
    }
    with running_gateway(
        tmp_path_factory.mktemp("alias-patterns"), models, redis_url, tenants=tenants
    ) as gw:
        yield gw


def claude(gateway: Gateway, who: str = "acme") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=f"sk-test-{who}", max_retries=0)


def codex(gateway: Gateway, who: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=f"sk-test-{who}", max_retries=0)


def test_claude_code_names_reach_the_model_their_pattern_names(gateway: Gateway) -> None:
    client = claude(gateway)
    for name, serving in [
        ("claude-opus-4-8[1m]", "large"),
        ("claude-haiku-4-5-20251001", "small"),  # the more specific pattern
        ("large", "large"),
    ]:
        message = client.messages.create(model=name, max_tokens=4, messages=ASK)
        assert message.model == serving
        assert message.content


def test_the_access_log_names_the_alias_the_client_sent(gateway: Gateway) -> None:
    # Ops see which tools' names reach which model; a 1 MB name is logged cut short.
    claude(gateway).messages.create(model="claude-opus-4-8[1m]", max_tokens=4, messages=ASK)
    with pytest.raises(openai.NotFoundError):
        codex(gateway).responses.create(model="x" * 100_000, input="Hi")

    def lines() -> list[dict[str, Any]]:
        parsed = (orjson.loads(line) for line in gateway.log.splitlines() if line.startswith("{"))
        return [line for line in parsed if line.get("logger") == "gateway.access"]

    deadline = time.monotonic() + 15
    while not any(line.get("requested_model") == "claude-opus-4-8[1m]" for line in lines()):
        assert time.monotonic() < deadline, gateway.log[-2000:]
        time.sleep(0.1)
    *_, line = [line for line in lines() if line.get("requested_model") == "claude-opus-4-8[1m]"]
    assert (line["model"], line["served_model"], line["status"]) == ("large", "large", 200)
    assert all(len(line.get("requested_model") or "") <= 256 for line in lines())
    assert all(len(line["model"]) < 100 for line in lines())  # a label: configured names only


def test_codex_names_reach_the_model_on_both_openai_wires(gateway: Gateway) -> None:
    client = codex(gateway)
    response = client.responses.create(model="gpt-5.6-codex", input="Hi", max_output_tokens=4)
    assert response.model == "large"
    chat = client.chat.completions.create(model="codex-mini-latest", messages=ASK, max_tokens=4)
    assert chat.model == "large"


def test_a_tenants_own_map_wins(gateway: Gateway) -> None:
    message = claude(gateway, "globex").messages.create(
        model="claude-opus-4-8[1m]", max_tokens=4, messages=ASK
    )
    assert message.model == "small"
    # Not in its map: the models' `codex-*` names `large`, which globex may not use.
    with pytest.raises(openai.PermissionDeniedError):
        codex(gateway, "globex").chat.completions.create(
            model="codex-mini-latest", messages=ASK, max_tokens=4
        )


def test_an_unknown_name_is_a_404_each_client_reads(gateway: Gateway) -> None:
    name = "llama-9[1m]"
    with pytest.raises(anthropic.NotFoundError) as anthropic_error:
        claude(gateway).messages.create(model=name, max_tokens=4, messages=ASK)
    body: Any = anthropic_error.value.body
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert name in body["error"]["message"]
    assert name in str(anthropic_error.value)  # what Claude Code shows
    for call in (
        lambda c: c.chat.completions.create(model=name, messages=ASK, max_tokens=4),
        lambda c: c.responses.create(model=name, input="Hi", max_output_tokens=4),
    ):
        with pytest.raises(openai.NotFoundError) as openai_error:
            call(codex(gateway))
        assert openai_error.value.code == "model_not_found"
        assert name in openai_error.value.message


def test_a_reload_changes_the_tenants_map_and_a_bad_one_is_refused(gateway: Gateway) -> None:
    """Last in the module: it changes the tenants file (and puts it back)."""
    tenants = {
        "acme": tenant("acme", ["*"]),
        "globex": tenant("globex", ["small"], aliases={"claude-*": "small", "gpt-*": "small"}),
    }

    def served(name: str) -> str:
        return claude(gateway).messages.create(model=name, max_tokens=4, messages=ASK).model

    def wait_for(check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 15
        while not check():
            assert time.monotonic() < deadline, gateway.log[-2000:]
            time.sleep(0.1)

    try:
        gateway.write_tenants(
            {**tenants, "acme": {**tenants["acme"], "aliases": {"claude-*": "small"}}}
        )
        wait_for(lambda: served("claude-opus-4-8[1m]") == "small")
        # globex may not use `large`: refused at its line, the running map stays.
        bad = {
            **tenants,
            "acme": tenant("acme", ["*"]),
            "globex": {**tenants["globex"], "aliases": {"claude-*": "large"}},
        }
        gateway.write_tenants(bad)
        wait_for(lambda: "may not use model 'large'" in gateway.log)
        assert f"{gateway.tenants_path}:" in gateway.log
        assert served("claude-opus-4-8[1m]") == "small"
        message = claude(gateway, "globex").messages.create(
            model="claude-opus-4-8[1m]", max_tokens=4, messages=ASK
        )
        assert message.model == "small"
    finally:
        gateway.write_tenants(tenants)
        wait_for(lambda: served("claude-opus-4-8[1m]") == "large")
