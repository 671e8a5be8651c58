"""Parsed tool lists kept by their JSON (`gateway.api.tool_lists`): a repeated list gives
what parsing it gives, a refused list is refused every time, and the cache stays
bounded however many lists a tenant invents."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.body import decode_json, parse_tools
from gateway.api.errors import APIError
from gateway.api.openai.openai_requests import parse_chat, parse_embeddings
from gateway.api.responses.responses_answers import response_body, response_object
from gateway.api.responses.responses_requests import parse_responses
from gateway.api.tool_lists import MAX_KEY_BYTES, ToolListCache, ToolsJSON, as_json
from gateway.inference.types import Completion, Usage
from gateway.storage.idempotency_store import fingerprint


def tool(name: str, description: str = "d") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}  # fmt: skip


def test_a_repeated_list_gives_what_parsing_it_gives() -> None:
    tools = [tool("read"), tool("write")]
    cache = ToolListCache(parse_tools)
    first, second = cache.parse(tools), cache.parse([tool("read"), tool("write")])
    assert first == second == parse_tools(tools)
    # A list that differs in anything is its own entry.
    assert cache.parse([tool("read"), tool("write", "other")])[1].description == "other"


def test_a_refused_list_is_refused_every_time() -> None:
    calls = []

    def counting(raw: object) -> object:
        calls.append(raw)
        return parse_tools(raw)

    cache = ToolListCache(counting)
    for _ in range(2):
        with pytest.raises(APIError):
            cache.parse([tool("bad name")])
    assert len(calls) == 2


def test_the_cache_is_bounded_in_entries_and_entry_size() -> None:
    calls: list[object] = []
    cache = ToolListCache(lambda raw: calls.append(raw) or len(calls), entries=4)
    for i in range(100):
        cache.parse([tool(f"t{i}")])
    assert len(cache._entries) == 4
    big = [tool("t", "x" * MAX_KEY_BYTES)]
    cache.parse(big)
    cache.parse(big)
    assert calls[-2:] == [big, big]  # parsed each time, never kept
    # The least recently used goes first: a list in use stays.
    cache.parse([tool("t99")])
    before = len(calls)
    cache.parse([tool("t99")])
    assert len(calls) == before


def test_each_wire_gives_the_same_request_from_the_cache() -> None:
    forced = {"type": "function", "function": {"name": "f"}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "q"}],
            "tools": [tool("f")], "tool_choice": forced}  # fmt: skip
    assert parse_chat(chat, 16) == parse_chat(chat, 16)
    responses = {"model": "m", "input": "q",
                 "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}  # fmt: skip
    first, again = parse_responses(responses, 16), parse_responses(responses, 16)
    assert first.options == again.options and again.omitted_tools == ("web_search",)


def test_a_body_whose_tools_stay_text_has_a_stable_idempotency_fingerprint() -> None:
    # It was a 500: the fingerprint serialized the body, tools' text and all.
    def print_of(body: bytes) -> str:
        return fingerprint("/v1/responses", as_json(decode_json(body)))

    body = b'{"model": "m", "input": "q", "tools": [{"type": "function", "name": "f"}]}'
    data = decode_json(body)
    assert isinstance(data["tools"], ToolsJSON)
    assert print_of(body) == print_of(body)
    assert print_of(body.replace(b'"f"', b'"g"')) != print_of(body)
    # Key order still does not matter, as for every other field.
    reordered = b'{"tools": [{"type": "function", "name": "f"}], "input": "q", "model": "m"}'
    assert print_of(reordered) == print_of(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'["tools"]', "must be a JSON object"),
        (b'{"tools": [}', "not valid JSON"),
        (b'{"tools": [], "n": ' + b"1" * 400 + b"}", "not valid JSON"),  # orjson's limit
        (b'{"tools": [' + b"[" * 2000 + b"]" * 2000 + b"]}", "more than 128 levels"),
    ],
)
def test_a_body_with_tools_that_is_not_json_is_a_400(body: bytes, message: str) -> None:
    with pytest.raises(APIError, match=message) as refused:
        decode_json(body)
    assert refused.value.status == 400


def test_tools_left_as_text_parse_as_they_would_have_and_null_is_none() -> None:
    chat = (
        b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "tools": [{"type": '
        b'"function", "function": {"name": "f", "parameters": {"type": "object"}}}]}'
    )
    request = parse_chat(decode_json(chat), 16)
    assert [tool.name for tool in request.options.tools] == ["f"]
    assert decode_json(b'{"model": "m", "tools": null}')["tools"] is None
    deep = b"[" * 130 + b"]" * 130
    with pytest.raises(APIError, match="more than 128 levels"):
        parse_chat(decode_json(chat.replace(b'{"type": "object"}', deep)), 16)
    # A huge integer in the tools is the client's 400, not the gateway's 500.
    with pytest.raises(APIError, match="not valid JSON"):
        parse_chat(decode_json(chat.replace(b'"object"', b"1" * 400)), 16)


def test_the_responses_answer_echoes_the_tools_as_sent() -> None:
    body = b'{"model": "m", "input": "q", "tools": [ {"type": "function", "name": "f"} ]}'
    request = parse_responses(decode_json(body), 16)
    echoed = orjson.loads(response_body([request], [Completion("hi", Usage(1, 1), "stop")],
                                        response_id="r", model="m"))["tools"]  # fmt: skip
    assert echoed == [{"type": "function", "name": "f"}]


def test_the_cache_keeps_at_most_its_byte_budget() -> None:
    cache = ToolListCache(lambda raw: 1, size=10_000)
    for i in range(40):
        cache.parse([tool(f"t{i}", "x" * 1_000)])
    assert sum(len(key) for key in cache._entries) <= 10_000
    assert 0 < len(cache._entries) < 40


def test_a_streamed_answer_echoes_pretty_printed_tools_on_one_line() -> None:
    # A client's pretty-printed `tools` ended an SSE event's data line early.
    body = (
        b'{"model": "m", "input": "q", "stream": true,\n "tools": [\n\n  '
        b'{"type": "function",\r\n "name": "f"}\n]}'
    )
    request = parse_responses(decode_json(body), 16)
    echoed = orjson.dumps(response_object(request, "r", "m", 0, "in_progress", [], None))
    assert b"\n" not in echoed and b"\r" not in echoed
    assert orjson.loads(echoed)["tools"] == [{"type": "function", "name": "f"}]


def test_embeddings_refuse_tools_that_are_not_json_as_the_rest_of_a_body() -> None:
    body = b'{"model": "e", "input": "q", "tools": [' + b"1" * 400 + b"]}"
    with pytest.raises(APIError, match="not valid JSON"):
        parse_embeddings(decode_json(body), 16)
