"""Budgets behind a running gateway, through the SDKs: a tenant spends its budget until
the gateway refuses with `insufficient_quota` (`billing_error` on Messages); what Redis
holds as spent is what the requests cost, as the spend counter and the ledger say."""

from __future__ import annotations

import asyncio
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
from gateway.observability.access import RequestRecord
from tests.inprocess.conftest import started_gateway

# 100 prompt tokens at 3.0 a million and 50 out at 15.0: 1,050 micro-units a request.
COST = 300 + 750
AMOUNT = 0.005


def prices(per_million_in: float, per_million_out: float) -> Callable[[dict[str, Any]], None]:
    """An edit of gateway.yaml: both chat models at these prices."""

    def edit(config: dict[str, Any]) -> None:
        config["prices"] = {
            "currency": "EUR",
            "models": {
                name: {"input_per_million": per_million_in, "output_per_million": per_million_out}
                for name in ("llm-large", "llm-small")
            },
        }

    return edit


priced = prices(3.0, 15.0)


def budgeted(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["acme"]["budgets"] = [{"amount": AMOUNT, "period": "day"}]


def spent_counted(model: str = "llm-large") -> float:
    """What the spend counter holds for acme's requests that `model` ran."""
    labels = {"tenant": "acme", "model": model}
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
    counted_before = spent_counted(), spent_counted("llm-small")

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
    assert spent_counted() - counted_before[0] == 90_000
    assert spent_counted("llm-small") - counted_before[1] == 200


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


def small_budgeted(tenants: dict[str, Any]) -> None:
    """acme: 1,000 micro-units a day on llm-small only (llm-large uncapped)."""
    tenants["tenants"]["acme"]["budgets"] = [
        {"amount": 0.001, "period": "day", "model": "llm-small"}
    ]


# One micro-unit a token, in and out.
one_a_token = prices(1.0, 1.0)


async def test_a_fallback_is_charged_to_the_budget_of_the_model_that_served_it(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, finding 2: a request names llm-large (no budget) and falls back to
    llm-small, whose budget of 1,000 was spent 6.25 times over. Now each fallback takes
    llm-small's budget before it is tried and is charged there (200 each): five are
    served, then the fallback is refused and the request ends as llm-large's failure
    would, the record naming the refused fallback; llm-small's budget ends at its
    amount, not past it, and llm-large's own buckets are not charged what it did not
    serve."""
    path = config_for(edit=one_a_token, edit_tenants=small_budgeted)
    async with started_gateway(path, monkeypatch) as gw:
        records = gw.finished_records()
        for url in ("http://large-a", "http://large-b"):
            gw.upstream.break_replica(url, lambda: UpstreamError(MODEL_FAILED))
        gw.upstream.script("llm-small", *[Completion("x", Usage(100, 100))] * 10)
        answers = []
        async with gw.http() as client:
            for _ in range(7):
                answer = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "llm-large",
                        "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 100,
                    },
                )
                answers.append(answer)
    statuses = [answer.status_code for answer in answers]
    assert statuses[:5] == [200] * 5
    # Each answer tells the budget it was charged to: llm-small's, going down.
    remaining = [float(answer.headers["x-budget-remaining"]) for answer in answers[:5]]
    assert remaining == sorted(remaining, reverse=True) and remaining[0] < 0.001
    # A refused fallback is never silent.
    for refused_answer in answers[5:]:
        assert refused_answer.headers["x-gateway-fallback-refused"] == "llm-small; reason=spend"
    assert all(status >= 500 for status in statuses[5:]), statuses
    assert await redis_spend(path, "spend:day:llm-small", 1000) == 1000
    served = [r for r in records if r.status == 200]
    assert {r.served_model for r in served} == {"llm-small"}
    assert [r.cost_micros for r in served] == [200] * 5
    refused = [r for r in records if r.status != 200]
    assert all("llm-large->llm-small:refused_spend" in r.fallbacks for r in refused)
    assert all(r.cost_micros == 0 for r in refused)


async def cut_at_the_deadline(
    path: Path, monkeypatch: pytest.MonkeyPatch, times: int, per_token_s: float | None = None
) -> list[RequestRecord]:
    """`times` chats of `max_tokens: 1000` to llm-large, a model that never answers, each
    cut by `x-request-timeout: 0.05` (a 504); their records. `per_token_s`: the model's
    measured time per token before them (None: nothing measured, a fresh gateway)."""
    async with started_gateway(path, monkeypatch) as gw:
        records = gw.finished_records()
        route = gw.app.app.state.runtime.routes["llm-large"]  # type: ignore[attr-defined]
        route.resilience.latency.per_token_s = per_token_s

        async def computing(url: str, upstream_call: Any) -> Any:
            await asyncio.sleep(30)  # cut at the deadline

        monkeypatch.setattr(route.backend, "complete", computing)
        async with gw.http(**{"x-request-timeout": "0.05"}) as client:
            for _ in range(times):
                answer = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "llm-large",
                        "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 1000,
                    },
                )
                assert answer.status_code == 504
    assert len(records) == times
    return records


async def test_a_request_cut_by_its_deadline_pays_what_the_replica_can_have_made(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, finding 3: `max_tokens: 1000` and `x-request-timeout: 0.05` on a model
    that never answers was recorded as 1,000 completion tokens. Now its record names the
    model that ran it and at most what that model can make in the time it ran, at its
    measured 10 ms a token: at least 5 (it ran 50 ms at least), far from 1,000."""
    [record] = await cut_at_the_deadline(config_for(edit=one_a_token), monkeypatch, 1, 0.01)
    assert record.served_model == "llm-large"
    assert 5 <= record.completion_tokens < 1000
    assert record.cost_micros == record.prompt_tokens + record.completion_tokens


async def test_a_fresh_gateways_cut_pays_at_most_a_thousand_tokens_a_second(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second hostile review of issue 40: on a fresh gateway (no answer measured), the
    deadline's own lower bound (1,000 tokens "made" in 50 ms) became the rate the cut was
    charged at: 1,000 tokens for a 504 in 50 ms. A gateway's first cuts, each twice."""
    for record in await cut_at_the_deadline(config_for(edit=one_a_token), monkeypatch, 2):
        assert record.served_model == "llm-large"
        # It ran 50 ms and more: at 1,000 tokens a second, 50 and a little more, never
        # all of max_tokens (a second would have to pass).
        assert 50 <= record.completion_tokens < 1000


async def test_an_answer_the_gateway_rejects_is_not_charged_its_price(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, finding 10: an answer that is not what `response_format` asks is a 502
    `invalid_structured_output`; it was billed in full. Its tokens still count against
    the rate limits (the replica made them); its price is not charged: the budget is
    whole and the record's cost is 0, with the tokens it used."""

    def structured(config: dict[str, Any]) -> None:
        priced(config)
        config["models"]["llm-large"]["capabilities"] = {"structured_outputs": True}
        config["models"]["llm-large"]["fallback"] = []

    path = config_for(edit=structured, edit_tenants=budgeted)
    async with started_gateway(path, monkeypatch) as gw:
        records = gw.finished_records()
        gw.upstream.script("llm-large", Completion("not json", Usage(100, 50)))
        async with gw.http() as client:
            answer = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "llm-large",
                    "messages": [{"role": "user", "content": "Hello"}],
                    "response_format": {"type": "json_object"},
                },
            )
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "invalid_structured_output"
    # Read once the gateway has stopped: its settles (sent in the background) are in.
    assert await redis_spend(path, "spend:day", round(AMOUNT * 1e6)) == 0
    [record] = records
    assert (record.status, record.cost_micros) == (502, 0)
    assert (record.prompt_tokens, record.completion_tokens) == (100, 50)
