"""A client's JSON-RPC message checked before anything is done with it
(gateway/mcp/jsonrpc.py): one message a body, a string or integer id, a named method,
params an object; what is refused is refused with the JSON-RPC code a client expects."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.mcp.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_ID_CHARS,
    MAX_METHOD_CHARS,
    JsonRpcError,
    Message,
    parse_message,
)


def request(**changes: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    message.update(changes)
    return message


def refusal(value: Any) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as raised:
        parse_message(value)
    return raised.value


def test_a_request_is_parsed_with_its_id_method_and_params() -> None:
    message = parse_message(request(id="abc", method="tools/call", params={"name": "x"}))
    assert message == Message("tools/call", {"name": "x"}, "abc")
    assert message.is_request and not message.is_response


def test_a_batch_is_refused_as_an_invalid_request() -> None:
    error = refusal([request(id=1), request(id=2)])
    assert error.code == INVALID_REQUEST
    assert "batches are not supported" in error.message
    assert refusal([]).code == INVALID_REQUEST


@pytest.mark.parametrize("value", ["tools/list", 7, None, True, 1.5])
def test_a_message_that_is_not_an_object_is_refused(value: Any) -> None:
    assert refusal(value).code == INVALID_REQUEST


@pytest.mark.parametrize("version", ["1.0", "2", 2.0, None])
def test_a_wrong_jsonrpc_version_is_refused(version: Any) -> None:
    assert refusal(request(jsonrpc=version)).code == INVALID_REQUEST


def test_a_message_without_jsonrpc_version_is_refused() -> None:
    message = request()
    del message["jsonrpc"]
    assert refusal(message).code == INVALID_REQUEST


@pytest.mark.parametrize(
    "request_id", ["", "req-1", "x" * MAX_ID_CHARS, 0, -1, 42, 2**53, -(2**53)]
)
def test_string_and_integer_ids_are_taken_as_they_are(request_id: str | int) -> None:
    message = parse_message(request(id=request_id))
    assert message.id == request_id
    assert type(message.id) is type(request_id)
    assert message.is_request


@pytest.mark.parametrize(
    "request_id",
    [
        True,
        False,
        1.0,
        1.5,
        None,
        {"id": 1},
        [1],
        "x" * (MAX_ID_CHARS + 1),
        2**53 + 1,
        -(2**53) - 1,
        2**64,
    ],
)
def test_an_id_that_is_not_a_short_string_or_a_safe_integer_is_refused(
    request_id: Any,
) -> None:
    error = refusal(request(id=request_id))
    assert error.code == INVALID_REQUEST
    assert "request id" in error.message


@pytest.mark.parametrize(
    "response",
    [
        {"jsonrpc": "2.0", "id": 3, "result": {}},
        {"jsonrpc": "2.0", "id": "s-1", "result": {"roots": []}},
        {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}},
    ],
)
def test_a_response_to_a_request_of_the_gateway_is_a_response_not_a_request(
    response: dict[str, Any],
) -> None:
    message = parse_message(response)
    assert message.is_response
    assert not message.is_request
    assert message.id == response["id"]


def test_a_response_with_a_bad_id_is_refused() -> None:
    assert refusal({"jsonrpc": "2.0", "id": 1.5, "result": {}}).code == INVALID_REQUEST


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "params": {}},
        {"jsonrpc": "2.0", "result": {}},  # a response needs the id it answers
        {"jsonrpc": "2.0"},
    ],
)
def test_a_message_without_a_method_that_is_no_response_is_refused(
    message: dict[str, Any],
) -> None:
    error = refusal(message)
    assert error.code == INVALID_REQUEST
    assert "method" in error.message


@pytest.mark.parametrize("method", ["", 5, None, ["tools/list"], {"m": 1}, "m" * 129])
def test_a_method_that_is_not_a_string_of_at_most_128_characters_is_refused(
    method: Any,
) -> None:
    error = refusal(request(method=method))
    assert error.code == INVALID_REQUEST
    assert "128" in error.message


def test_a_method_of_exactly_128_characters_is_taken() -> None:
    method = "m" * MAX_METHOD_CHARS
    assert parse_message(request(method=method)).method == method


def test_null_or_absent_params_are_an_empty_object() -> None:
    assert parse_message(request(params=None)).params == {}
    message = request()
    del message["params"]
    assert parse_message(message).params == {}


@pytest.mark.parametrize("params", [[1, 2], "x", 3, True])
def test_params_that_are_not_an_object_are_invalid_params(params: Any) -> None:
    error = refusal(request(params=params))
    assert error.code == INVALID_PARAMS


def test_a_notification_has_no_id_and_is_not_a_request() -> None:
    message = parse_message({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert message == Message("notifications/initialized", {}, None)
    assert not message.is_request
    assert not message.is_response


def test_an_error_s_body_carries_its_data_only_when_there_is_some() -> None:
    assert JsonRpcError(-32600, "bad").body() == {"code": -32600, "message": "bad"}
    body = JsonRpcError(-32602, "bad", {"field": "x"}).body()
    assert body == {"code": -32602, "message": "bad", "data": {"field": "x"}}
