"""Parsed tool lists kept by their JSON (`gateway.api.tool_lists`): a repeated list gives
what parsing it gives, a refused list is refused every time, and the cache stays
bounded however many lists a tenant invents."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.errors import APIError
from gateway.api.requests import parse_chat, parse_tools
from gateway.api.responses_requests import parse_responses
from gateway.api.tool_lists import MAX_KEY_BYTES, ToolListCache


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
