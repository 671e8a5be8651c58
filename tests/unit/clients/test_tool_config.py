"""`gateway tools config`: each tool's files and environment point it at the gateway."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest

from gateway.cli import main
from gateway_tools.clients.tool_config import KEY_PLACEHOLDER, KEY_VARIABLE, TOOLS, config_for

URL = "http://gateway.example:8080/"


def test_codex_gets_a_responses_provider_on_the_gateway(tmp_path: Path) -> None:
    config = config_for("codex", URL, "sk-test", "llm-large")
    (path,) = config.write(tmp_path)
    assert path == tmp_path / ".codex" / "config.toml"
    toml = tomllib.loads(path.read_text())
    assert toml["model"] == "llm-large" and toml["model_provider"] == "gateway"
    provider = toml["model_providers"]["gateway"]
    assert provider["base_url"] == "http://gateway.example:8080/v1"
    assert provider["wire_api"] == "responses"
    assert config.env == {provider["env_key"]: "sk-test"}  # the key never in a file
    assert "sk-test" not in path.read_text()


def test_claude_code_gets_the_messages_api_at_the_root_and_stays_home() -> None:
    env = config_for("claude", URL, "sk-test", "llm-large").env
    assert env["ANTHROPIC_BASE_URL"] == "http://gateway.example:8080"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "sk-test"
    assert env["ANTHROPIC_MODEL"] == "llm-large"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


def test_aider_and_opencode_get_the_openai_compatible_api(tmp_path: Path) -> None:
    aider = config_for("aider", URL, "sk-test", "llm-large")
    assert aider.env["OPENAI_API_BASE"] == "http://gateway.example:8080/v1"
    assert "--model openai/llm-large" in aider.run
    # Run once without a terminal, it asks nothing and calls no one but the gateway.
    for flag in ("--yes-always", "--no-check-update", "--no-analytics", "--no-show-release-notes"):
        assert flag in shlex.split(aider.run)
    opencode = config_for("opencode", URL, "sk-test", "llm-large")
    (path,) = opencode.write(tmp_path)
    written = json.loads(path.read_text())
    assert written["autoupdate"] is False and written["share"] == "disabled"
    assert opencode.env == {KEY_VARIABLE: "sk-test", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    assert "sk-test" not in path.read_text()
    provider = written["provider"]["gateway"]
    assert provider["options"]["baseURL"] == "http://gateway.example:8080/v1"
    assert provider["options"]["apiKey"] == "{env:" + KEY_VARIABLE + "}"
    assert "llm-large" in provider["models"]


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_printed_exports_are_safe_for_a_shell(tool: str) -> None:
    key = "sk-it's $HOME"  # what a shell would expand or choke on
    text = config_for(tool, URL, key, "m").render()
    exports = [line for line in text.splitlines() if line.startswith("export ")]
    assert exports
    for line in exports:
        name, _, value = line.removeprefix("export ").partition("=")
        assert shlex.split(value) == [config_for(tool, URL, key, "m").env[name]]


def test_an_unknown_tool_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="one of codex, claude, aider, opencode"):
        config_for("cursor", URL, "k", "m")


def test_the_command_prints_and_writes_the_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["tools", "config", "codex", "--url", URL, "--write-home", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("# ~/.codex/config.toml\n")
    assert "export GATEWAY_API_KEY=sk-your-tenant-key" in out
    assert (tmp_path / ".codex" / "config.toml").is_file()


@pytest.mark.parametrize("tool", ["codex", "claude", "opencode", "aider"])
def test_the_docs_show_what_the_command_prints(tool: str) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "coding-tools.md").read_text()
    block = doc.split(f"<!-- tools-config:{tool} -->\n```sh\n", 1)[1].split("\n```", 1)[0]
    printed = config_for(tool, "http://gateway.example:8080", KEY_PLACEHOLDER, "local-coder")
    assert block == printed.render().rstrip()


@pytest.mark.parametrize("url", ["http://gw:8080", "http://gw:8080/", "http://gw:8080/v1"])
def test_the_url_may_be_given_as_the_demo_prints_it(url: str) -> None:
    # The demo prints ".../v1": pasted as is, Codex asked /v1/v1/responses.
    assert config_for("claude", url, "k", "m").env["ANTHROPIC_BASE_URL"] == "http://gw:8080"
    toml = tomllib.loads(config_for("codex", url, "k", "m").files[".codex/config.toml"])
    assert toml["model_providers"]["gateway"]["base_url"] == "http://gw:8080/v1"


@pytest.mark.parametrize("model", ["x;touch PWN #", "x $(touch PWN)", "a'b", "x😀y"])
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_model_name_with_shell_or_odd_characters_stays_one_word(tool: str, model: str) -> None:
    # `aider --model openai/x;touch PWN` ran `touch` when pasted into a shell.
    config = config_for(tool, URL, "k", model)
    words = shlex.split(config.run)
    assert not any(word.startswith("touch") or word == ";" for word in words)
    if tool == "aider":
        assert f"openai/{model}" in words
    if tool == "codex":
        assert tomllib.loads(config.files[".codex/config.toml"])["model"] == model


def test_codex_and_claude_may_be_left_to_their_own_default_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The gateway's alias patterns route the names they send (docs/coding-tools.md).
    (path,) = config_for("codex", URL, "sk-test", None).write(tmp_path)
    assert "model" not in tomllib.loads(path.read_text())
    assert "ANTHROPIC_MODEL" not in config_for("claude", URL, "sk-test", None).env
    assert main(["tools", "config", "claude", "--tool-default-model"]) == 0
    assert "ANTHROPIC_MODEL" not in capsys.readouterr().out
    # aider and opencode have no default model: the command says so.
    assert main(["tools", "config", "aider", "--tool-default-model"]) == 2
    assert "aider has no default model" in capsys.readouterr().err


def test_write_home_keeps_a_users_own_settings_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = tmp_path / ".codex" / "config.toml"
    own.parent.mkdir(parents=True)
    own.write_text('model = "o3"\n[mcp_servers.foo]\ncommand = "foo"\n')
    args = ["tools", "config", "codex", "--url", URL, "--write-home", str(tmp_path)]
    assert main(args) == 2
    assert "exists with other settings; --force replaces it" in capsys.readouterr().err
    assert own.read_text().startswith('model = "o3"')  # untouched
    assert main([*args, "--force"]) == 0
    assert 'model = "llm-large"' in own.read_text()
    assert main(args) == 0  # the same content again: nothing to refuse
    # A tool configured by its environment alone says so; --model and the tool's own
    # default exclude each other.
    assert main(["tools", "config", "claude", "--write-home", str(tmp_path)]) == 0
    assert "has no files" in capsys.readouterr().err
    assert main(["tools", "config", "codex", "--model", "m", "--tool-default-model"]) == 2


def test_codex_and_claude_code_get_the_gateway_s_mcp_endpoint_with_the_key_from_the_env() -> None:
    toml = tomllib.loads(config_for("codex", URL, "sk-k", "m").files[".codex/config.toml"])
    assert toml["mcp_servers"]["gateway"] == {
        "url": "http://gateway.example:8080/mcp",
        "bearer_token_env_var": "GATEWAY_API_KEY",
    }
    claude = config_for("claude", URL + "v1", "sk-k", "m")
    (setup,) = claude.setup
    assert shlex.split(setup) == [
        "claude", "mcp", "add", "--scope", "user", "--transport", "http", "gateway", "http://gateway.example:8080/mcp",
        "--header", "Authorization: Bearer $ANTHROPIC_AUTH_TOKEN",
    ]  # fmt: skip
    # The key itself is in no file and no command: only in the environment.
    assert "sk-k" not in setup and "sk-k" not in "".join(claude.files.values())
