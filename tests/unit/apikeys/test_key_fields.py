"""A key's fields as the admin API receives them: `mcp_tools` (issue 45), a key's own
narrowing of its tenant's MCP tools, checked on a create and on an update."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apikeys.errors import KeyRequestInvalid
from gateway.apikeys.key_fields import MAX_MCP_TOOLS, create_fields, update_fields
from gateway.config import Tenant, hash_key

NOW = 1_800_000_000.0
TENANT = Tenant(api_keys=[hash_key("sk-acme")], models=["*"])
TENANTS = {"acme": TENANT}
MODELS = {"llm-small"}


def created(**fields: Any) -> Any:
    return create_fields({"tenant": "acme", "name": "ci", **fields}, TENANTS, MODELS, NOW)[1]


def updated(**fields: Any) -> Any:
    return update_fields(fields, "acme", TENANT, MODELS, NOW)


@pytest.mark.parametrize(
    "patterns",
    [
        ["notes/echo"],
        ["github/*", "notes"],
        ["*"],
        ["notes-*/echo", "n?tes/[ae]*", "[!h]*/list_*"],
        ["notes/tool.name_v2-x"],
        ["x" * 200],
        [],
        ["notes/echo"] * MAX_MCP_TOOLS,
    ],
)
def test_mcp_tools_patterns_are_taken(patterns: list[str]) -> None:
    assert created(mcp_tools=patterns).mcp_tools == tuple(dict.fromkeys(patterns))
    fields = updated(mcp_tools=patterns)
    assert fields.mcp_tools == tuple(dict.fromkeys(patterns)) and "mcp_tools" in fields.given


def test_mcp_tools_null_or_absent_is_all_of_the_tenant_s() -> None:
    assert created().mcp_tools is None
    assert created(mcp_tools=None).mcp_tools is None
    cleared = updated(mcp_tools=None)
    assert cleared.mcp_tools is None and cleared.given == {"mcp_tools"}
    assert "mcp_tools" not in updated(name="other").given


@pytest.mark.parametrize(
    "value",
    [
        "notes/echo",  # not a list
        {"notes": "echo"},
        [7],
        ["notes/echo", None],
        [""],
        ["x" * 201],
        ["notes/echo"] * (MAX_MCP_TOOLS + 1),
        ["notes/"],
        ["/echo"],
        ["notes/echo/more"],
        ["notes//echo"],
        ["no tes/echo"],
        ["notes/ec ho"],
        ["notes/echo\n"],
        ["notes/\x00"],
        ["notes\x7f"],
        ["notes_server/echo"],
        ["nötes/echo"],
        [" *"],
        True,
        1,
    ],
)
def test_anything_else_is_refused_naming_mcp_tools(value: Any) -> None:
    for make in (created, updated):
        with pytest.raises(KeyRequestInvalid) as refused:
            make(mcp_tools=value)
        assert refused.value.param == "mcp_tools"


def test_an_update_without_fields_names_mcp_tools_among_what_to_give() -> None:
    with pytest.raises(KeyRequestInvalid) as refused:
        updated()
    assert "mcp_tools" in refused.value.message
