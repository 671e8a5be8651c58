"""Who reaches which tool (gateway/mcp/tool_reach.py): the tenant's `mcp.tools` patterns
(`server`, `server/*`, `server/tool`, with `*` and `?`), narrowed by a managed key's own:
a caller reaches what both allow, and sees a server only if some tool of it may be."""

from __future__ import annotations

import pytest

from gateway.mcp.tool_reach import McpAccess


def test_a_star_alone_reaches_every_tool_of_every_server() -> None:
    access = McpAccess(("*",))
    assert access.allows("github", "create_issue")
    assert access.allows("files", "read_file")
    assert access.sees_server("anything")


@pytest.mark.parametrize("pattern", ["github", "github/*"])
def test_a_server_alone_or_with_star_reaches_all_its_tools_and_no_other_server(
    pattern: str,
) -> None:
    access = McpAccess((pattern,))
    assert access.allows("github", "create_issue")
    assert access.allows("github", "get_me")
    assert not access.allows("gitlab", "create_issue")
    assert not access.allows("github-enterprise", "create_issue")
    assert access.sees_server("github")
    assert not access.sees_server("gitlab")


def test_a_server_and_tool_pattern_reaches_that_tool_only() -> None:
    access = McpAccess(("github/create_issue",))
    assert access.allows("github", "create_issue")
    assert not access.allows("github", "delete_repo")
    assert not access.allows("github", "create_issue_comment")
    assert not access.allows("files", "create_issue")


def test_star_and_question_mark_match_within_a_name() -> None:
    access = McpAccess(("files/read_*", "docs/v?", "*-prod/ping"))
    assert access.allows("files", "read_file")
    assert access.allows("files", "read_multiple_files")
    assert not access.allows("files", "write_file")
    assert access.allows("docs", "v1")
    assert not access.allows("docs", "v10")
    assert access.allows("db-prod", "ping")
    assert not access.allows("db-prod", "query")
    assert not access.allows("db-staging", "ping")


def test_patterns_are_case_sensitive() -> None:
    access = McpAccess(("github/get_*",))
    assert not access.allows("GitHub", "get_me")
    assert not access.allows("github", "Get_me")


def test_no_pattern_reaches_nothing() -> None:
    access = McpAccess(())
    assert not access.allows("github", "get_me")
    assert not access.sees_server("github")


def test_a_server_is_seen_when_any_of_its_tools_may_be_reached() -> None:
    access = McpAccess(("files/read_*",))
    assert access.sees_server("files")
    assert not access.sees_server("github")


def test_a_key_s_patterns_narrow_its_tenant_s_reach() -> None:
    access = McpAccess(("github/*", "docs"), key_patterns=("docs", "github/get_*"))
    assert access.allows("docs", "search_docs")
    assert access.allows("github", "get_me")
    # The tenant allows it, the key does not.
    assert not access.allows("github", "create_issue")
    assert access.sees_server("github")


def test_a_key_cannot_reach_beyond_its_tenant() -> None:
    access = McpAccess(("docs",), key_patterns=("*",))
    assert access.allows("docs", "read_doc")
    assert not access.allows("github", "get_me")
    assert not access.sees_server("github")


def test_a_key_with_no_pattern_reaches_nothing_of_its_tenant_s() -> None:
    access = McpAccess(("*",), key_patterns=())
    assert not access.allows("docs", "read_doc")
    assert not access.sees_server("docs")


def test_a_server_is_seen_only_when_both_tenant_and_key_see_it() -> None:
    access = McpAccess(("github/get_*", "files"), key_patterns=("files/read_file",))
    assert access.sees_server("files")
    assert not access.sees_server("github")
    assert access.allows("files", "read_file")
    assert not access.allows("files", "write_file")


def test_without_key_patterns_the_tenant_s_reach_is_the_caller_s() -> None:
    access = McpAccess(("docs",), key_patterns=None)
    assert access.allows("docs", "read_doc")
    assert not access.allows("github", "get_me")
