"""JSON-RPC 2.0 as MCP uses it: one message per body, checked before anything is done
with it, and the error objects the gateway answers with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The standard codes, and MCP's own.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Implementation-defined server errors (-32000 to -32099): the gateway's refusals.
UPSTREAM_ERROR = -32000
UPSTREAM_TIMEOUT = -32001
RESULT_TOO_LARGE = -32003
BLOCKED = -32004
RATE_LIMITED = -32029
# MCP's own: a resource that is not there; a header that says otherwise than the body.
RESOURCE_NOT_FOUND = -32002
HEADER_MISMATCH = -32020

# A client's request id: a string or an integer (JSON-RPC allows null only for errors).
RequestId = str | int
MAX_ID_CHARS = 256
MAX_METHOD_CHARS = 128


class JsonRpcError(Exception):
    """An error answered to the client as a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def body(self) -> dict[str, Any]:
        """The `error` member of a response."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass(frozen=True, slots=True)
class Message:
    """One client message: a request (`id` set), a notification (no `id`), or a
    response to a request of the server's (`is_response`)."""

    method: str
    params: dict[str, Any]
    id: RequestId | None = None
    is_response: bool = False

    @property
    def is_request(self) -> bool:
        return self.id is not None and not self.is_response


def parse_message(value: Any) -> Message:
    """The message `value` (parsed JSON) holds; `JsonRpcError` (INVALID_REQUEST) for a
    batch (MCP removed batching in 2025-06-18), a wrong version, a bad id or method."""
    if isinstance(value, list):
        raise JsonRpcError(
            INVALID_REQUEST, "JSON-RPC batches are not supported: one message a request"
        )
    if not isinstance(value, dict):
        raise JsonRpcError(INVALID_REQUEST, "a JSON-RPC message is an object")
    if value.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, 'a JSON-RPC message has "jsonrpc": "2.0"')
    has_id = "id" in value
    message_id = value.get("id")
    if has_id and not _valid_id(message_id):
        raise JsonRpcError(
            INVALID_REQUEST, "a request id is a string or an integer, at most 256 characters"
        )
    if "method" not in value:
        if has_id and ("result" in value or "error" in value):
            return Message("", {}, message_id, is_response=True)
        raise JsonRpcError(INVALID_REQUEST, "a JSON-RPC request names its method")
    method = value["method"]
    if not isinstance(method, str) or not method or len(method) > MAX_METHOD_CHARS:
        raise JsonRpcError(INVALID_REQUEST, "a method is a string of at most 128 characters")
    params = value.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise JsonRpcError(INVALID_PARAMS, "params is an object")
    return Message(method, params, message_id if has_id else None)


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**53) <= value <= 2**53
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS


def result(message_id: RequestId, body: dict[str, Any]) -> dict[str, Any]:
    """A response carrying `body` as its result."""
    return {"jsonrpc": "2.0", "id": message_id, "result": body}


def error(message_id: RequestId | None, exc: JsonRpcError) -> dict[str, Any]:
    """A response carrying `exc` as its error (id null when the request's is unknown)."""
    return {"jsonrpc": "2.0", "id": message_id, "error": exc.body()}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """A notification message."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params:
        message["params"] = params
    return message
