"""Client errors: OpenAI-shaped, and never carrying a secret (their messages are redacted)."""

from __future__ import annotations

import orjson

from gateway.api import errors
from gateway.api.errors import APIError
from gateway.api.responses import sse_error
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
        "The model `llama-3.1-8b-instruct` does not exist."
    )
    assert errors.invalid_api_key().message == (
        "Incorrect API key provided. Pass it as `Authorization: Bearer KEY`."
    )
    assert errors.upstream_failed("m1", "HTTP 500 from http://10.0.0.7:8000/v1").message == (
        "The backend for `m1` failed: HTTP 500 from http://10.0.0.7:8000/v1"
    )
