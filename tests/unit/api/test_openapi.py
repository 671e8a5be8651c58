"""The OpenAPI document states what the parser accepts."""

from __future__ import annotations

from gateway.api.openai.openai_requests import DEFAULT_ONLY
from gateway.api.openapi import CHAT_REQUEST, DEFAULT_ONLY_SCHEMAS, openapi_document


def test_the_fields_taken_only_at_their_default_are_the_parsers() -> None:
    assert set(DEFAULT_ONLY_SCHEMAS) == set(DEFAULT_ONLY)


def test_the_served_document_names_the_models() -> None:
    document = openapi_document(["llm-large", "llm-small"])
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = chat["content"]["application/json"]["schema"]
    assert schema["properties"]["model"] == {"type": "string", "enum": ["llm-large", "llm-small"]}
    assert CHAT_REQUEST["properties"]["model"] == {"type": "string", "minLength": 1}
