"""The OpenAPI document of the gateway's own endpoints, served at `GET /openapi.json`.

It states what the gateway really accepts (`api/requests.py` is the parser it mirrors),
not all of OpenAI's API: a field outside it is refused with a 400 naming the field, or
ignored when the schema leaves `additionalProperties` open. The live fuzzer
(`tests/e2e/test_fuzz.py`) checks every answer against it: a 2xx or a 4xx with an
OpenAI-shaped error, never a 5xx.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.api.body import MAX_STOP, MAX_TOOLS
from gateway.api.openai.openai_requests import (
    COMPLETION_ONLY,
    INT64,
    MAX_CHOICES,
    MAX_N,
    MAX_TOP_LOGPROBS,
    ROLES,
)

Schema = dict[str, Any]

_INT64 = {"type": "integer", "minimum": INT64[0], "maximum": INT64[1]}
_STOP: Schema = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP},
        {"type": "null"},
    ]
}
_TEXT_PART: Schema = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_MESSAGE: Schema = {
    "type": "object",
    "properties": {
        "role": {"enum": sorted(ROLES)},
        "content": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": _TEXT_PART},
                {"type": "null", "description": "assistant messages only"},
            ]
        },
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"$ref": "#/components/schemas/ToolCall"}},
        "tool_call_id": {"type": "string", "minLength": 1},
    },
    "required": ["role"],
}
_TOOL_CALL: Schema = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "arguments": {"type": "string"},
            },
            "required": ["name", "arguments"],
        },
    },
    "required": ["id", "function"],
}
# A client's JSON Schema (tool parameters, `response_format`), described as the recursive
# shape it is, so that the fuzzer sends nested ones too: the gateway takes local `$ref`s
# only, within `server.json_schema`'s caps of size, depth and properties.
_JSON_SCHEMA_REF: Schema = {"$ref": "#/components/schemas/JsonSchema"}
_JSON_SCHEMA: Schema = {
    "type": "object",
    "description": "a JSON Schema (local `$ref`s only; size, depth and properties capped)",
    "properties": {
        "type": {"enum": ["object", "array", "string", "integer", "number", "boolean", "null"]},
        "description": {"type": "string"},
        "properties": {"type": "object", "additionalProperties": _JSON_SCHEMA_REF},
        "items": _JSON_SCHEMA_REF,
        "anyOf": {"type": "array", "items": _JSON_SCHEMA_REF},
        "required": {"type": "array", "items": {"type": "string"}},
        "enum": {"type": "array"},
        "pattern": {"type": "string"},
        "$ref": {"type": "string"},
        "$defs": {"type": "object", "additionalProperties": _JSON_SCHEMA_REF},
    },
}
_TOOL: Schema = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": _JSON_SCHEMA_REF,
                "strict": {"type": "boolean"},
            },
            "required": ["name"],
        },
    },
    "required": ["type", "function"],
}
_TOOLS: dict[str, Schema] = {
    "tools": {"type": "array", "items": _TOOL, "maxItems": MAX_TOOLS},
    "tool_choice": {
        "oneOf": [
            {"enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
                "description": "one of `tools`, by name",
            },
        ]
    },
    "parallel_tool_calls": {"type": "boolean"},
    "logprobs": {"type": "boolean"},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    "response_format": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"type": {"enum": ["text", "json_object"]}},
                "required": ["type"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "json_schema"},
                    "json_schema": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                            "schema": _JSON_SCHEMA_REF,
                            "strict": {"type": "boolean"},
                            "description": {"type": "string"},
                        },
                        "required": ["name"],
                    },
                },
                "required": ["type", "json_schema"],
            },
        ]
    },
}
# Fields OpenAI defines for behaviour the gateway does not implement: only the value
# that asks for the default is accepted (`requests.DEFAULT_ONLY`, the same fields).
DEFAULT_ONLY_SCHEMAS: dict[str, Schema] = {
    "functions": {"type": "array", "maxItems": 0},
    "function_call": {"enum": ["none", "auto"]},
    "presence_penalty": {"const": 0},
    "frequency_penalty": {"const": 0},
    "logit_bias": {"type": "object", "maxProperties": 0},
    "suffix": {"const": ""},
}
_SAMPLING: dict[str, Schema] = {
    "model": {"type": "string", "minLength": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stop": _STOP,
    "seed": _INT64,
    "stream": {"type": "boolean"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean"}},
        "description": "only with stream: true",
    },
    "user": {"type": "string"},
}
CHAT_REQUEST: Schema = {
    "type": "object",
    "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        **_TOOLS,
        **DEFAULT_ONLY_SCHEMAS,
        **{name: {"const": default} for name, default in COMPLETION_ONLY.items()},
    },
    "required": ["model", "messages"],
}
COMPLETION_REQUEST: Schema = {
    "type": "object",
    "properties": {
        **_SAMPLING,
        "prompt": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": MAX_CHOICES,
                    "description": f"n times the prompts: at most {MAX_CHOICES}",
                },
            ]
        },
        "echo": {"type": "boolean"},
        "best_of": {"type": "integer", "minimum": 1, "description": "equal to n"},
        **DEFAULT_ONLY_SCHEMAS,
    },
    "required": ["model", "prompt"],
}
EMBEDDINGS_REQUEST: Schema = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            ],
            "description": "text (token ids are refused); at most the model's max_inputs",
        },
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": {"type": "string"},
    },
    "required": ["model", "input"],
}
_BLOCK: Schema = {
    "type": "object",
    "properties": {"type": {"enum": ["text", "tool_use", "tool_result"]}},
    "required": ["type"],
    "description": "text {text}, tool_use {id, name, input}, tool_result {tool_use_id, content}",
}
MESSAGES_REQUEST: Schema = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "role": {"enum": ["user", "assistant"]},
                    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
                },
                "required": ["role", "content"],
            },
        },
        "stop_sequences": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "maxItems": MAX_STOP,
        },
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "description": {"type": "string"},
                    "input_schema": _JSON_SCHEMA_REF,
                },
                "required": ["name", "input_schema"],
            },
            "maxItems": MAX_TOOLS,
        },
        "tool_choice": {
            "type": "object",
            "properties": {
                "type": {"enum": ["auto", "any", "tool", "none"]},
                "name": {"type": "string"},
            },
            "required": ["type"],
        },
        "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
    },
    "required": ["model", "max_tokens", "messages"],
}
RESPONSES_REQUEST: Schema = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "type": {"enum": ["message", "function_call", "function_call_output"]}
                        },
                    },
                },
            ]
        },
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "store": {"type": "boolean"},
        "previous_response_id": {"type": "string"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                    "parameters": _JSON_SCHEMA_REF,
                },
                "required": ["type", "name"],
            },
            "maxItems": MAX_TOOLS,
        },
        "parallel_tool_calls": {"type": "boolean"},
        "metadata": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "maxProperties": 16,
        },
        "user": {"type": "string"},
    },
    "required": ["model", "input"],
}
ERROR: Schema = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def _errors(*statuses: int) -> dict[str, Schema]:
    return {
        str(status): {
            "description": "An OpenAI-shaped error",
            "content": {"application/json": {"schema": ERROR}},
        }
        for status in statuses
    }


def _completion_operation(summary: str, request: Schema) -> Schema:
    return {
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": [
            {"name": "x-priority", "in": "header", "schema": {"type": "string"}},
            {"name": "x-request-timeout", "in": "header", "schema": {"type": "string"}},
            {"name": "idempotency-key", "in": "header", "schema": {"type": "string"}},
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {
            "200": {
                "description": "The completion, or its SSE stream with `stream: true`",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **_errors(400, 401, 403, 404, 409, 413, 422, 429, 503, 504),
        },
    }


def _operation(
    summary: str,
    statuses: Sequence[int],
    *,
    path: Sequence[str] = (),
    query: Schema | None = None,
    body: Schema | None = None,
    body_type: str = "application/json",
) -> Schema:
    """An operation that answers JSON (or, for content, bytes)."""
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in path
    ] + [{"name": name, "in": "query", "schema": schema} for name, schema in (query or {}).items()]
    operation: Schema = {
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": parameters,
        "responses": {
            "200": {"description": summary, "content": {"application/json": {"schema": {}}}},
            **_errors(*statuses),
        },
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {body_type: {"schema": body}}}
    return operation


# One JSON-RPC message to `/mcp` (docs/mcp.md): the methods it serves, and any params.
MCP_MESSAGE: Schema = {
    "type": "object",
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer"]},
        "method": {
            "type": "string",
            "enum": [
                "initialize", "ping", "server/discover", "tools/list", "tools/call",
                "resources/list", "resources/templates/list", "resources/read",
                "prompts/list", "prompts/get", "logging/setLevel",
                "notifications/initialized", "notifications/cancelled",
            ],
        },
        "params": {"type": "object"},
    },
    "required": ["jsonrpc", "method"],
}  # fmt: skip


def _mcp_operation() -> Schema:
    """`POST /mcp`: one JSON-RPC message; its refusals are JSON-RPC error objects."""
    rpc_error = {"description": "A JSON-RPC error", "content": {"application/json": {"schema": {}}}}
    return {
        "summary": "MCP: one JSON-RPC message to the servers behind the gateway",
        "security": [{"bearer": []}],
        "parameters": [
            {"name": "Mcp-Session-Id", "in": "header", "schema": {"type": "string"}},
            {"name": "MCP-Protocol-Version", "in": "header", "schema": {"type": "string"}},
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": MCP_MESSAGE}}},
        "responses": {
            "200": {
                "description": "A JSON-RPC response",
                "content": {"application/json": {"schema": {}}},
            },
            "202": {"description": "A notification taken"},
            **{str(status): rpc_error for status in (400, 401, 403, 404, 413, 415, 429)},
        },
    }


def _limit(most: int) -> Schema:
    return {"type": "integer", "minimum": 1, "maximum": most}


def batch_paths(messages: Schema) -> dict[str, Schema]:
    """The Batch APIs' paths (docs/batches.md), when the gateway serves them."""
    # Anthropic's batch requests: each a Messages body (`params`).
    batch_request = {
        "type": "object",
        "properties": {
            "custom_id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
            "params": messages,
        },
        "required": ["custom_id", "params"],
    }
    create_batch = {
        "type": "object",
        "properties": {
            "input_file_id": {"type": "string"},
            "endpoint": {
                "enum": [
                    "/v1/chat/completions",
                    "/v1/completions",
                    "/v1/embeddings",
                    "/v1/responses",
                ]
            },
            "completion_window": {"const": "24h"},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["input_file_id", "endpoint", "completion_window"],
    }
    upload = {
        "type": "object",
        "properties": {
            "purpose": {"const": "batch"},
            "file": {"type": "string", "format": "binary"},
        },
        "required": ["purpose", "file"],
    }
    four = (400, 401, 404, 409, 413, 429)
    return {
        "/v1/files": {
            "post": _operation(
                "Upload a batch input file", four, body=upload, body_type="multipart/form-data"
            ),
            "get": _operation(
                "This tenant's files",
                four,
                query={
                    "after": {"type": "string"},
                    "limit": _limit(10_000),
                    "order": {"enum": ["asc", "desc"]},
                    "purpose": {"type": "string"},
                },
            ),
        },
        "/v1/files/{file_id}": {
            "get": _operation("A file", four, path=["file_id"]),
            "delete": _operation("Delete a file", four, path=["file_id"]),
        },
        "/v1/files/{file_id}/content": {
            "get": _operation("A file's bytes", four, path=["file_id"]),
        },
        "/v1/batches": {
            "post": _operation("Create a batch", four, body=create_batch),
            "get": _operation(
                "This tenant's batches, newest first",
                four,
                query={"after": {"type": "string"}, "limit": _limit(100)},
            ),
        },
        "/v1/batches/{batch_id}": {"get": _operation("A batch", four, path=["batch_id"])},
        "/v1/batches/{batch_id}/cancel": {
            "post": _operation("Cancel a batch", four, path=["batch_id"]),
        },
        "/v1/messages/batches": {
            "post": _operation(
                "Create a message batch",
                four,
                body={
                    "type": "object",
                    "properties": {
                        "requests": {"type": "array", "items": batch_request, "minItems": 1}
                    },
                    "required": ["requests"],
                },
            ),
            "get": _operation(
                "This tenant's message batches",
                four,
                query={
                    "after_id": {"type": "string"},
                    "before_id": {"type": "string"},
                    "limit": _limit(1000),
                },
            ),
        },
        "/v1/messages/batches/{batch_id}": {
            "get": _operation("A message batch", four, path=["batch_id"]),
            "delete": _operation("Delete an ended message batch", four, path=["batch_id"]),
        },
        "/v1/messages/batches/{batch_id}/cancel": {
            "post": _operation("Cancel a message batch", four, path=["batch_id"]),
        },
        "/v1/messages/batches/{batch_id}/results": {
            "get": _operation("A message batch's results (JSON lines)", four, path=["batch_id"]),
        },
    }


def openapi_document(models: Sequence[str] = (), *, batches: bool = False) -> Schema:
    """The document (OpenAPI 3.1); with `models`, the `model` fields name them; with
    `batches`, the Batch APIs' paths are in it."""
    schemas: tuple[Schema, ...] = (
        CHAT_REQUEST, COMPLETION_REQUEST, EMBEDDINGS_REQUEST, MESSAGES_REQUEST, RESPONSES_REQUEST
    )  # fmt: skip
    if models:
        model = {"type": "string", "enum": list(models)}
        schemas = tuple(
            {**schema, "properties": {**schema["properties"], "model": model}} for schema in schemas
        )
    chat, text, embeddings, messages, responses = schemas
    return {
        "openapi": "3.1.0",
        "info": {"title": "Inference gateway", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"ToolCall": _TOOL_CALL, "JsonSchema": _JSON_SCHEMA},
        },
        "paths": {
            "/v1/chat/completions": {"post": _completion_operation("Chat completion", chat)},
            "/v1/completions": {"post": _completion_operation("Text completion", text)},
            "/v1/embeddings": {"post": _completion_operation("Embeddings", embeddings)},
            "/v1/messages": {"post": _completion_operation("Anthropic Messages", messages)},
            "/v1/messages/count_tokens": {
                "post": _completion_operation("Anthropic token count", messages)
            },
            "/v1/responses": {"post": _completion_operation("OpenAI Responses", responses)},
            "/mcp": {"post": _mcp_operation()},
            "/v1/responses/{response_id}": {
                method: {
                    "summary": summary,
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "response_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": summary,
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401, 404, 503),
                    },
                }
                for method, summary in (
                    ("get", "A stored response of this key's tenant"),
                    ("delete", "Forget a stored response of this key's tenant"),
                )
            },
            "/v1/models": {
                "get": {
                    "summary": "The models this key may use",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": {
                            "description": "A list of models",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model this key may use (404 for any other)",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The model",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401, 404),
                    },
                }
            },
            **(batch_paths(messages) if batches else {}),
            "/livez": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {
                "get": {
                    "summary": "Readiness (503 when this instance cannot serve)",
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "not ready"},
                    },
                }
            },
        },
    }
