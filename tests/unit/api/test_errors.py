"""Client errors: OpenAI-shaped, and never carrying a secret (their messages are redacted)."""

from __future__ import annotations

import orjson

from gateway.api import errors
from gateway.api.errors import APIError
from gateway.api.openai.openai_answers import sse_error
from gateway.ratelimit.decisions import Decision
from tests.unit.observability.secret_samples import ALL_SECRETS, SECRETS, leftovers_in


def test_client_errors_never_carry_a_secret() -> None:
    error = errors.upstream_failed("m1", f"upstream error: {ALL_SECRETS}")
    assert leftovers_in(error.message) == []
    assert leftovers_in(str(error)) == []
    assert leftovers_in(orjson.dumps(error.body()).decode()) == []
    assert leftovers_in(bytes(error.response().body).decode()) == []
    assert leftovers_in(sse_error(error.body()).decode()) == []
    direct = APIError(400, f"bad value {SECRETS['aws secret in json'][0]}")
    assert leftovers_in(orjson.dumps(direct.body()).decode()) == []


def test_client_errors_without_secrets_are_unchanged() -> None:
    assert errors.model_not_found("llama-3.1-8b-instruct").message == (
        "The model `llama-3.1-8b-instruct` does not exist or you do not have access to it."
    )
    assert errors.invalid_api_key().message == (
        "Incorrect API key provided. Pass it as `Authorization: Bearer KEY`."
    )
    assert errors.upstream_failed("m1", "HTTP 500 from http://10.0.0.7:8000/v1").message == (
        "The backend for `m1` failed: HTTP 500 from http://10.0.0.7:8000/v1"
    )


def test_a_refusal_names_the_limit_and_the_wait() -> None:
    tokens = Decision(False, refused_by="tokens", retry_after_s=2.2, limit=1000)
    assert errors.rate_limited(tokens).message == (
        "Rate limit reached: 1000 tokens per minute for your organization; retry in 3 s."
    )
    busy = Decision(False, refused_by="concurrency", retry_after_s=1.0, limit=4)
    assert errors.rate_limited(busy).message == (
        "Too many requests in flight for your organization (at most 4 at once); "
        "wait for one to finish."
    )


def test_a_huge_model_name_is_repeated_cut() -> None:
    # A 1 MB name made a 1 MB error body.
    message = errors.model_not_found("gpt-" + "A" * 1_000_000).message
    assert len(message) < 400 and "gpt-AAAA" in message and "..." in message
