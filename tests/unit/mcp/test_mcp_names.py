"""What a client sees of the servers' names and failures (gateway/mcp/mcp_service.py): a
tool is `{server}__{tool}`, split back at the first `__`; an upstream's failure becomes the
JSON-RPC error the docs promise (-32001 a timeout, -32003 a result too large, -32000 for
the rest), an upstream's own code passed on only inside JSON-RPC's reserved range."""

from __future__ import annotations

import pytest

from gateway.mcp.jsonrpc import RESULT_TOO_LARGE, UPSTREAM_ERROR, UPSTREAM_TIMEOUT
from gateway.mcp.mcp_service import _client_error, public_name, split_name
from gateway.mcp.upstream_peer import UpstreamFailure


def test_a_tool_s_public_name_is_its_server_and_name_joined_by_two_underscores() -> None:
    assert public_name("github", "create_issue") == "github__create_issue"
    assert split_name("github__create_issue") == ("github", "create_issue")


@pytest.mark.parametrize(
    ("server", "tool"),
    [
        ("github", "create_issue"),
        ("files", "read__file"),  # a tool's own `__` stays in its name
        ("files", "__init__"),
        ("db-prod", "x"),
        ("a", "b__c__d"),
    ],
)
def test_split_name_gives_back_what_public_name_joined(server: str, tool: str) -> None:
    assert split_name(public_name(server, tool)) == (server, tool)


def test_a_tool_name_holding_two_underscores_keeps_the_rest_whole() -> None:
    assert split_name("files__read__file") == ("files", "read__file")
    assert split_name("files___x") == ("files", "_x")


@pytest.mark.parametrize(
    "name", ["create_issue", "github_create_issue", "", "__create_issue", "github__", "__"]
)
def test_a_name_without_a_server_and_a_tool_is_none_of_the_gateway_s(name: str) -> None:
    assert split_name(name) is None


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        ("timeout", UPSTREAM_TIMEOUT),
        ("too_large", RESULT_TOO_LARGE),
        ("unavailable", UPSTREAM_ERROR),
        ("malformed", UPSTREAM_ERROR),
        ("error", UPSTREAM_ERROR),  # an error without a code of the server's
    ],
)
def test_each_failure_is_told_to_the_client_with_its_code(outcome: str, code: int) -> None:
    error = _client_error(UpstreamFailure(outcome, f"it was {outcome}"))
    assert (error.code, error.message) == (code, f"it was {outcome}")
    assert (UPSTREAM_TIMEOUT, RESULT_TOO_LARGE, UPSTREAM_ERROR) == (-32001, -32003, -32000)


def test_a_timeout_is_minus_32001_even_with_a_code() -> None:
    assert _client_error(UpstreamFailure("timeout", "slow", code=-32602)).code == -32001


def test_an_upstream_method_not_found_is_the_gateway_s_upstream_error() -> None:
    # The client asked the gateway, which has the method: -32601 would mislead it.
    error = _client_error(UpstreamFailure("error", "Method not found", code=-32601))
    assert (error.code, error.message) == (-32000, "Method not found")


@pytest.mark.parametrize("code", [-32602, -32603, -32002, -32700, -32768, -32000, -32099])
def test_an_upstream_code_in_the_reserved_range_is_passed_on(code: int) -> None:
    assert _client_error(UpstreamFailure("error", "m", code=code)).code == code


@pytest.mark.parametrize("code", [-31999, -32769, 0, 1, 404, -1, 2**40, -(2**40)])
def test_an_upstream_code_outside_the_reserved_range_becomes_minus_32000(code: int) -> None:
    assert _client_error(UpstreamFailure("error", "m", code=code)).code == UPSTREAM_ERROR


def test_a_long_upstream_message_is_cut_to_2000_characters() -> None:
    error = _client_error(UpstreamFailure("error", "x" * 10_000, code=-32602))
    assert error.message == "x" * 2000
    assert len(_client_error(UpstreamFailure("timeout", "y" * 5000)).message) == 2000
