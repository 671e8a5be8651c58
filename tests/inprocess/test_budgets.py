"""Budgets behind a running gateway, through the SDKs: a tenant spends its budget until
the gateway refuses with `insufficient_quota` (`billing_error` on Messages); what Redis
holds as spent is what the requests cost, as the spend counter and the ledger say."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from redis.asyncio import Redis

from gateway.backends.base import MODEL_FAILED, UpstreamError
from gateway.config import hash_key
from gateway.inference.types import Completion, UpstreamCall, Usage
from gateway.observability import metrics
from tests.inprocess.conftest import started_gateway

# 100 prompt tokens at 3.0 a million and 50 out at 15.0: 1,050 micro-units a request.
COST = 300 + 750
AMOUNT = 0.005


def priced(config: dict[str, Any]) -> None:
    config["prices"] = {
        "currency": "EUR",
        "models": {
            name: {"input_per_million": 3.0, "output_per_million": 15.0}
            for name in ("llm-large", "llm-small")
        },
    }


def budgeted(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["acme"]["budgets"] = [{"amount": AMOUNT, "period": "day"}]


def spent_counted() -> float:
    labels = {"tenant": "acme", "model": "llm-large"}
    return metrics.REGISTRY.get_sample_value("gateway_spend_micros_total", labels) or 0.0


async def test_a_tenant_spends_its_budget_through_the_openai_sdk_until_refused(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config_for(edit=priced, edit_tenants=budgeted)
    counted_before = spent_counted()
    async with started_gateway(path, monkeypatch) as gw:
        client = gw.openai()
        answered = 0
        remaining = []
        for _ in range(10):
            gw.upstream.script("llm-large", Completion("Hi!", Usage(100, 50)))
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="llm-large", messages=[{"role": "user", "content": "Hello"}]
                )
            except openai.RateLimitError as refused:
                error = refused
                break
            answered += 1
            remaining.append(float(raw.headers["x-budget-remaining"]))
        else:
            pytest.fail("never refused")
        # Each reserves its prompt and 64 tokens out (~1,000) and settles to 1,050: the
        # fifth may cost more than the 800 left.
        assert answered == 4
        assert error.code == "insufficient_quota"
        assert error.response.headers["x-should-retry"] == "false"
        assert 0 < int(error.response.headers["retry-after"]) <= 86_400
        assert float(error.response.headers["x-budget-remaining"]) == pytest.approx(
            AMOUNT - 4 * COST / 1e6
        )
        assert remaining == sorted(remaining, reverse=True)
        # On Messages, the same refusal in Anthropic's words: 402 billing_error, which
        # its SDK does not retry.
        with pytest.raises(anthropic.APIStatusError) as messages_refused:
            await gw.anthropic().messages.create(
                model="llm-large", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
            )
        body = messages_refused.value.body
        assert messages_refused.value.status_code == 402
        assert isinstance(body, dict) and body["error"]["type"] == "billing_error"
    # Redis holds exactly what the four cost, and so does the counter.
    gateway_config = yaml.safe_load(path.read_text())
    redis = Redis.from_url(gateway_config["redis"]["url"])
    prefix = gateway_config["redis"]["key_prefix"]
    try:
        state = await redis.get(f"{prefix}:{{acme}}:spend:day")
    finally:
        await redis.aclose()
    assert state is not None
    assert AMOUNT * 1e6 - float(state.split()[0]) == 4 * COST
    assert spent_counted() - counted_before == 4 * COST


ADMIN_KEY = "sk-test-budget-admin"


def budgeted_with_admin(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["ops"] = {"api_keys": [hash_key(ADMIN_KEY)], "models": [], "admin": True}


async def test_a_managed_key_spends_its_own_budget_and_another_key_of_its_tenant_goes_on(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /admin/keys` with a small budget: that key is refused with insufficient_quota
    once it may cost more than is left; the tenant's other key is not."""
    path = config_for(edit=priced, edit_tenants=budgeted_with_admin)
    async with started_gateway(path, monkeypatch) as gw:
        async with gw.http(ADMIN_KEY) as admin:
            made = await admin.post(
                "/admin/keys",
                json={
                    "tenant": "acme",
                    "name": "ci-job",
                    "budget": {"amount": 0.003, "period": "total"},
                },
            )
        assert made.status_code == 201, made.text
        key = made.json()["key"]
        answered = 0
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(10):
                gw.upstream.script("llm-large", Completion("Hi!", Usage(100, 50)))
                await gw.openai(key).chat.completions.create(
                    model="llm-large", messages=[{"role": "user", "content": "Hello"}]
                )
                answered += 1
        # 3,000 micro-units: two requests of 1,050, then the third's ~1,000 at most does
        # not fit the 900 left; a total budget does not renew.
        assert answered == 2
        assert refused.value.code == "insufficient_quota"
        assert "does not renew" in refused.value.message
        assert "retry-after" not in refused.value.response.headers
        gw.upstream.script("llm-large", Completion("Hi!", Usage(100, 50)))
        other = await gw.openai().chat.completions.create(
            model="llm-large", messages=[{"role": "user", "content": "Hello"}]
        )
        assert other.choices[0].message.content == "Hi!"


def dear_and_cheap(config: dict[str, Any]) -> None:
    config["prices"] = {
        "models": {
            "llm-large": {"input_per_million": 30.0, "output_per_million": 60.0},
            "llm-small": {"input_per_million": 0.1, "output_per_million": 0.1},
        }
    }


async def test_each_part_of_a_request_is_charged_at_the_model_that_served_it(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prompts, the first falling back to the cheap model: the budget, the counter and
    the record are charged each part's own price, not the whole at the first part's
    (found by the hostile review: 400 micro-units charged for 90,200)."""
    path = config_for(edit=dear_and_cheap, edit_tenants=budgeted_per_day(1.0))
    counted_before = spent_counted()

    def large(url: str, call: UpstreamCall) -> Completion:
        if "AAAA" in call.prompt:
            raise UpstreamError(MODEL_FAILED)
        return Completion("x", Usage(1000, 1000))

    async with started_gateway(path, monkeypatch) as gw:
        gw.upstream.script("llm-large", *[large] * 10)
        gw.upstream.script("llm-small", Completion("x", Usage(1000, 1000)))
        async with gw.http() as client:
            answer = await client.post(
                "/v1/completions",
                json={"model": "llm-large", "prompt": ["AAAA", "BBBB"], "max_tokens": 1000},
            )
        assert answer.status_code == 200, answer.text
        assert "llm-large->llm-small" in answer.headers["x-gateway-fallback"]
    # 1000 in and 1000 out at 30/60 a million (BBBB), and at 0.1/0.1 (AAAA).
    assert await redis_spend(path, "spend:day", 1_000_000) == 90_000 + 200
    assert spent_counted() - counted_before == 90_000 + 200


def budgeted_per_day(amount: float) -> Callable[[dict[str, Any]], None]:
    def edit(tenants: dict[str, Any]) -> None:
        tenants["tenants"]["acme"]["budgets"] = [{"amount": amount, "period": "day"}]

    return edit


async def redis_spend(path: Path, name: str, amount_micros: int) -> float:
    """What the budget `name` of acme has spent, as the gateway's Redis holds it."""
    config = yaml.safe_load(path.read_bytes())  # noqa: ASYNC240 - a small file, once
    redis = Redis.from_url(config["redis"]["url"])
    try:
        state = await redis.get(f"{config['redis']['key_prefix']}:{{acme}}:{name}")
    finally:
        await redis.aclose()
    return 0.0 if state is None else amount_micros - float(state.split()[0])


@pytest.mark.parametrize(
    "prompt",
    [
        " 1" * 2000,  # digits apart: a token each with most tokenizers, 4x the estimate
        "\u00e9\u0301" * 1000,  # combining marks: 2 bytes a character, each its own token
        "\U0001f9ea" * 1000,  # emoji: up to 4 tokens each in byte-level BPE
    ],
    ids=["spaced-digits", "combining-marks", "emoji"],
)
async def test_a_budget_reserves_what_a_prompt_can_cost_however_it_tokenizes(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, prompt: str
) -> None:
    """A prompt made to tokenize badly (a token per byte, byte-level BPE's most) cannot
    spend past its reservation: what is reserved at admission covers what the replica
    reports, so requests in flight never take a budget further than they reserved."""
    path = config_for(edit=priced, edit_tenants=budgeted_per_day(1.0))
    worst = len(prompt.encode())

    async with started_gateway(path, monkeypatch) as gw:
        gw.upstream.script("llm-large", Completion("x", Usage(worst, 10)))
        raw = await gw.openai().completions.with_raw_response.create(
            model="llm-large", prompt=prompt, max_tokens=10
        )
    reserved = 1_000_000 - float(raw.headers["x-budget-remaining"]) * 1e6
    cost = worst * 3 + 10 * 15
    assert reserved >= cost
    assert await redis_spend(path, "spend:day", 1_000_000) == cost
