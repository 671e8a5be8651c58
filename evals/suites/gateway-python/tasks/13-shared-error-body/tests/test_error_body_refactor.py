import importlib
import inspect
import json
from types import ModuleType
from typing import Any

import pytest

from api import auth, limits, validation
from api.auth import check_api_key
from api.limits import quota_exhausted, rate_limited
from api.validation import validate_chat_request


def envelope(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def errors_module() -> ModuleType:
    return importlib.import_module("api.errors")


def test_error_body() -> None:
    error_body = errors_module().error_body
    body = error_body("Nope.", "invalid_request_error", param="n", code="invalid_value")
    assert body == envelope("Nope.", "invalid_request_error", "n", "invalid_value")
    assert list(body["error"]) == ["message", "type", "param", "code"]
    assert error_body("Down.", "server_error") == envelope("Down.", "server_error", None, None)
    with pytest.raises(TypeError):
        error_body("x", "y", "positional-param")


def test_auth_bodies_unchanged() -> None:
    assert check_api_key("Bearer sk-test-000", {"sk-test-000"}) is None
    missing = envelope(
        "Missing bearer token in the Authorization header.",
        "invalid_request_error",
        None,
        "missing_api_key",
    )
    assert check_api_key(None, {"sk-test-000"}) == (401, missing)
    assert check_api_key("Basic abc", {"sk-test-000"}) == (401, missing)
    wrong = envelope(
        "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"
    )
    assert check_api_key("Bearer sk-test-999", {"sk-test-000"}) == (401, wrong)


def test_limit_bodies_unchanged() -> None:
    status, body, headers = rate_limited("acme", 0.2)
    assert (status, headers) == (429, {"Retry-After": "1"})
    assert body == envelope(
        "Rate limit reached for tenant acme. Retry in 1s.",
        "rate_limit_error",
        None,
        "rate_limit_exceeded",
    )
    assert rate_limited("acme", 2.5)[2] == {"Retry-After": "3"}
    assert quota_exhausted("globex") == (
        429,
        envelope(
            "Tenant globex has used its monthly token quota.",
            "insufficient_quota",
            None,
            "insufficient_quota",
        ),
    )


def test_validation_bodies_unchanged() -> None:
    ok = {"model": "llm-large", "messages": [{"role": "user", "content": "hi"}]}
    assert validate_chat_request(ok) is None
    assert validate_chat_request({"messages": []}) == (
        400,
        envelope(
            "'model' is required.", "invalid_request_error", "model", "missing_required_parameter"
        ),
    )
    assert validate_chat_request({"model": "m", "messages": []}) == (
        400,
        envelope(
            "'messages' must be a non-empty array.",
            "invalid_request_error",
            "messages",
            "invalid_value",
        ),
    )
    assert validate_chat_request({**ok, "temperature": 3}) == (
        400,
        envelope(
            "'temperature' must be between 0 and 2.",
            "invalid_request_error",
            "temperature",
            "invalid_value",
        ),
    )


def test_serialized_bodies_keep_key_order() -> None:
    _, body = quota_exhausted("acme")
    assert json.dumps(body) == (
        '{"error": {"message": "Tenant acme has used its monthly token quota.", '
        '"type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}'
    )
    result = validate_chat_request({"model": 1})
    assert result is not None
    assert list(result[1]["error"]) == ["message", "type", "param", "code"]


@pytest.mark.parametrize("module", [auth, limits, validation])
def test_envelope_is_built_in_one_place(module: ModuleType) -> None:
    errors_module()
    source = inspect.getsource(module)
    assert '"error":' not in source
    assert "'error':" not in source
    assert not hasattr(module, "_invalid")
