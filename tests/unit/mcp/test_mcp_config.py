"""gateway.yaml's `mcp` section (docs/mcp.md): each server remote (`url`) or local
(`command`), never both or neither; headers only for a remote one; names that keep
`{server}__{tool}` unambiguous; and every credential it names from the environment
present when the gateway starts, else refused at its `file:line`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loader import environment_problems, load_config
from gateway.config.schema import ToolChangePolicy
from tests.unit.config.test_loader import GATEWAY, TENANTS, problems, write

UNSET = "GATEWAY_TEST_MCP_UNSET_TOKEN"
SET = "GATEWAY_TEST_MCP_TOKEN"
URL = "https://mcp.example.com/mcp"
# GATEWAY is nine lines: `mcp:` is line 10, `servers:` 11, the first server's name 12 (a
# bad name is refused there), its first setting 13 (a bad server is refused where its
# mapping starts), its second 14.
NAME_AT = len(GATEWAY.splitlines()) + 3
SERVER_AT = NAME_AT + 1


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    monkeypatch.delenv(UNSET, raising=False)
    monkeypatch.setenv(SET, "token-value")


def mcp(servers: str, rest: str = "") -> str:
    return GATEWAY + "mcp:\n  servers:\n" + servers + rest


def test_a_remote_and_a_stdio_server_load_with_their_settings() -> None:
    gateway = mcp(
        f"""\
    github:
      url: https://mcp.example.com/mcp
      bearer_token_env: {SET}
      env_headers: {{X-Org: {SET}}}
      headers: {{X-Client: gateway}}
      external: true
    files-2:
      command: [node, /opt/mcp/server-filesystem/dist/index.js, /srv/shared]
      env_from: {{API_TOKEN: {SET}}}
      sandbox: {{read_only: [/opt/mcp], writable: [/srv/shared]}}
""",
        "  on_tool_change: flag\n",
    )
    write("tenants.yaml", TENANTS)
    config = load_config(write("gateway.yaml", gateway)).gateway.mcp
    github, files = config.servers["github"], config.servers["files-2"]
    assert (github.url, github.bearer_token_env) == ("https://mcp.example.com/mcp", SET)
    assert github.external and github.command is None
    assert files.command == ["node", "/opt/mcp/server-filesystem/dist/index.js", "/srv/shared"]
    assert (files.sandbox.read_only, files.sandbox.network) == (["/opt/mcp"], False)
    assert config.on_tool_change is ToolChangePolicy.FLAG


def test_without_the_section_no_server_is_served_and_changed_tools_are_hidden() -> None:
    write("tenants.yaml", TENANTS)
    config = load_config(write("gateway.yaml", GATEWAY)).gateway.mcp
    assert config.servers == {}
    assert config.on_tool_change is ToolChangePolicy.HIDE


@pytest.mark.parametrize(
    "server",
    [
        "      url: https://mcp.example.com/mcp\n      command: [node, x.js]\n",
        "      timeout_s: 5\n",
    ],
)
def test_a_server_with_both_url_and_command_or_neither_is_refused(server: str) -> None:
    found = problems(mcp("    github:\n" + server))
    assert found == [
        f"gateway.yaml:{SERVER_AT}: mcp.servers.github: an MCP server has either `url` "
        "(Streamable HTTP) or `command` (stdio)"
    ]


@pytest.mark.parametrize(
    "headers",
    [
        "headers: {X-Client: gateway}",
        f"env_headers: {{X-Org: {SET}}}",
        f"bearer_token_env: {SET}",
    ],
)
def test_headers_on_a_stdio_server_are_refused(headers: str) -> None:
    found = problems(mcp(f"    files:\n      command: [node, x.js]\n      {headers}\n"))
    assert found == [
        f"gateway.yaml:{SERVER_AT}: mcp.servers.files: headers are for a server with `url`; "
        "a stdio server takes `env`"
    ]


def test_env_on_a_remote_server_is_refused() -> None:
    found = problems(
        mcp("    github:\n      url: https://mcp.example.com/mcp\n      env: {A: b}\n")
    )
    assert len(found) == 1
    assert "`env`, `env_from` and `cwd` are for a stdio server" in found[0]


@pytest.mark.parametrize("name", ["my_server", "github_", "1server", "-files", "a" * 41])
def test_a_server_name_that_could_blur_server_and_tool_is_refused(name: str) -> None:
    found = problems(mcp(f"    {name}:\n      url: https://mcp.example.com/mcp\n"))
    assert len(found) == 1
    assert found[0].startswith(f"gateway.yaml:{NAME_AT}: mcp.servers.{name}")
    assert "String should match pattern" in found[0]


@pytest.mark.parametrize("name", ["github", "files-2", "GitHub", "a", "db-prod-eu"])
def test_letters_digits_and_dashes_starting_with_a_letter_name_a_server(name: str) -> None:
    assert problems(mcp(f"    {name}:\n      url: https://mcp.example.com/mcp\n")) == []


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        (f"url: {URL}\n      bearer_token_env: {UNSET}", "bearer_token_env"),
        (f"url: {URL}\n      env_headers: {{X-Org: {UNSET}}}", "env_headers.X-Org"),
        (f"command: [node, x.js]\n      env_from: {{API_TOKEN: {UNSET}}}", "env_from.API_TOKEN"),
    ],
)
def test_a_credential_from_an_unset_variable_is_refused_at_its_line(
    setting: str, where: str
) -> None:
    gateway = mcp(f"    github:\n      {setting}\n")
    # The files themselves are valid: a report reads them without the secrets ...
    assert problems(gateway) == []
    # ... but `gateway serve` and `check-config` ask the environment for them.
    found = environment_problems("gateway.yaml")
    assert found == [
        f"gateway.yaml:{SERVER_AT + 1}: mcp.servers.github.{where}: environment variable "
        f"{UNSET} is not set (the server's credential)"
    ]


def test_a_credential_from_an_empty_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNSET, "")
    server = (
        f"    github:\n      url: https://mcp.example.com/mcp\n      bearer_token_env: {UNSET}\n"
    )
    assert problems(mcp(server)) == []
    found = environment_problems("gateway.yaml")
    assert len(found) == 1 and f"environment variable {UNSET} is not set" in found[0]


def test_a_credential_from_a_set_variable_is_taken() -> None:
    server = f"    github:\n      url: https://mcp.example.com/mcp\n      bearer_token_env: {SET}\n"
    assert problems(mcp(server)) == []
    assert environment_problems("gateway.yaml") == []
