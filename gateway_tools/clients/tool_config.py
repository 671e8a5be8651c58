"""The configuration that points a coding tool at a gateway: `gateway tools config TOOL`.

One function per tool gives its files (under the user's home) and environment for a
gateway URL, a tenant's key and a model. The docs show this output and the tests that
run the real tools use it, so what the docs say is what was run. The key goes in an
environment variable, never in a file: a file is where keys leak from. Codex CLI and
Claude Code may be left to ask for their own default model (no model given): the
gateway's alias patterns route the names they send (docs/coding-tools.md).

- **Codex CLI** reads `~/.codex/config.toml` (`$CODEX_HOME`): a model provider with the
  Responses API (`wire_api = "responses"`), its key from an environment variable; and
  the gateway's MCP endpoint as its MCP server `gateway` (`[mcp_servers.gateway]`, the
  same key as its bearer token, from the same variable).
- **Claude Code** reads `ANTHROPIC_BASE_URL` and `ANTHROPIC_AUTH_TOKEN` (sent as
  `Authorization: Bearer`), the model from `ANTHROPIC_MODEL`, and stays off Anthropic's
  own services with `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`; the gateway's MCP
  endpoint is added once (`claude mcp add --transport http gateway ...`, the key as its
  `Authorization` header).
- **aider** speaks chat completions to an OpenAI-compatible base (`OPENAI_API_BASE`), the
  model named `openai/<model>`, with no update check, analytics or release notes.
- **opencode** reads `~/.config/opencode/opencode.json`: a provider of the AI SDK's
  OpenAI-compatible package, its key from an environment variable, with no automatic
  update or session sharing, and no fetch of models.dev's model list
  (`OPENCODE_DISABLE_MODELS_FETCH`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The variable that holds the tenant's key, for the tools that read one by its name.
KEY_VARIABLE = "GATEWAY_API_KEY"
# What the output shows where no key was given.
KEY_PLACEHOLDER = "sk-your-tenant-key"
# The gateway's MCP endpoint, as the tools name the server (docs/mcp.md).
MCP_SERVER_NAME = "gateway"


@dataclass(frozen=True, slots=True)
class ToolConfig:
    """What a tool needs to use the gateway: files (paths under the home directory),
    environment variables, and how to run it once without a terminal."""

    tool: str
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    run: str = ""
    # Commands run once, with `env` set (Claude Code's MCP server is added by its CLI).
    setup: tuple[str, ...] = ()

    def write(self, home: Path, *, replace: bool = True) -> list[Path]:
        """Write the files under `home` (a real home, or a test's own); their paths.
        Without `replace`, a file that exists with other content is refused
        (`FileExistsError`) before anything is written: it may hold the user's own
        settings (other providers, MCP servers)."""
        paths = {home / relative: text for relative, text in self.files.items()}
        if not replace:
            for path, text in paths.items():
                if path.exists() and path.read_text() != text:
                    raise FileExistsError(f"{path} exists with other settings")
        for path, text in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return list(paths)

    def render(self) -> str:
        """The configuration as a person reads it: each file, then a shell's exports,
        then the command."""
        parts = [f"# ~/{relative}\n{text.rstrip()}\n" for relative, text in self.files.items()]
        exports = "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in self.env.items()
        )
        parts.append(f"# environment\n{exports}\n")
        if self.setup:
            parts.append("# once, with that environment\n" + "\n".join(self.setup) + "\n")
        parts.append(f"# run once, without a terminal\n{self.run}\n")
        return "\n".join(parts)


def _toml_string(value: str) -> str:
    # A JSON string is a TOML basic string, unicode as it is (TOML refuses the surrogate
    # pairs JSON would escape an emoji into).
    return json.dumps(value, ensure_ascii=False)


def codex(base_url: str, key: str, model: str | None) -> ToolConfig:
    """Codex CLI: a model provider on the gateway's Responses API."""
    config = (
        ("" if model is None else f"model = {_toml_string(model)}\n")
        + 'model_provider = "gateway"\n'
        "\n"
        "[model_providers.gateway]\n"
        'name = "Inference gateway"\n'
        f"base_url = {_toml_string(base_url.rstrip('/') + '/v1')}\n"
        f'env_key = "{KEY_VARIABLE}"\n'
        'wire_api = "responses"\n'
        "\n"
        # The gateway's MCP servers, as one: its tools reach the model as `mcp__gateway__*`.
        f"[mcp_servers.{MCP_SERVER_NAME}]\n"
        f"url = {_toml_string(base_url.rstrip('/') + '/mcp')}\n"
        f'bearer_token_env_var = "{KEY_VARIABLE}"\n'
    )
    return ToolConfig(
        "codex",
        files={".codex/config.toml": config},
        env={KEY_VARIABLE: key},
        # Codex's own sandbox, read-only by default, as the files it may write.
        run="codex exec --skip-git-repo-check --sandbox workspace-write "
        '"write hello.py that prints hi"',
    )


# Claude Code's tools in a run of `gateway eval`: reading, editing, its shell.
CLAUDE_TOOLS = "Read,Edit,Write,Bash,Glob,Grep"


def claude(base_url: str, key: str, model: str | None) -> ToolConfig:
    """Claude Code: the Messages API at the gateway's root."""
    chosen = {} if model is None else {"ANTHROPIC_MODEL": model}
    return ToolConfig(
        "claude",
        env={
            "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
            "ANTHROPIC_AUTH_TOKEN": key,
            **chosen,
            # Its background tasks (titles, summaries) keep their own `claude-haiku-*`
            # names, which the gateway's aliases may send to a smaller model.
            # No telemetry, updates or error reports to Anthropic's own services.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        setup=(
            f"claude mcp add --scope user --transport http {MCP_SERVER_NAME} "
            f"{base_url.rstrip('/')}/mcp --header "
            '"Authorization: Bearer $ANTHROPIC_AUTH_TOKEN"',
        ),
        # File tools only: a shell tool would run the model's commands unsandboxed.
        run='claude -p "write hello.py that prints hi" --allowedTools Write,Edit',
    )


# aider without a terminal: no git, every question answered yes, nothing fetched or sent
# but the model's requests.
AIDER_FLAGS = (
    "--no-git --yes-always --no-show-model-warnings --no-check-update --no-analytics "
    "--no-show-release-notes"
)


def aider(base_url: str, key: str, model: str | None) -> ToolConfig:
    """aider: chat completions through its OpenAI-compatible provider."""
    model = _named(model, "aider")
    return ToolConfig(
        "aider",
        env={"OPENAI_API_BASE": base_url.rstrip("/") + "/v1", "OPENAI_API_KEY": key},
        run=(
            f"aider --model {shlex.quote('openai/' + model)} {AIDER_FLAGS} "
            '--message "write hello.py that prints hi" hello.py'
        ),
    )


def opencode(base_url: str, key: str, model: str | None) -> ToolConfig:
    """opencode: a provider of the AI SDK's OpenAI-compatible package."""
    model = _named(model, "opencode")
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"gateway/{model}",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "gateway": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Inference gateway",
                "options": {
                    "baseURL": base_url.rstrip("/") + "/v1",
                    "apiKey": f"{{env:{KEY_VARIABLE}}}",
                },
                "models": {model: {"name": model}},
            }
        },
    }
    return ToolConfig(
        "opencode",
        files={".config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"},
        # Its list of the providers' models comes from models.dev otherwise.
        env={KEY_VARIABLE: key, "OPENCODE_DISABLE_MODELS_FETCH": "1"},
        run='opencode run "write hello.py that prints hi"',
    )


def _named(model: str | None, tool: str) -> str:
    if model is None:
        raise ValueError(f"{tool} has no default model: name one")
    return model


TOOLS: dict[str, Callable[[str, str, str | None], ToolConfig]] = {
    "codex": codex,
    "claude": claude,
    "aider": aider,
    "opencode": opencode,
}


def batch_command(
    tool: str, instruction: str, model: str | None, files: Sequence[str] = ()
) -> list[str]:
    """The command that runs `tool` once on `instruction`, without a terminal and with
    no one to approve its steps, in a sandbox of the caller's (`gateway eval run
    --tool`): there the tool's own sandbox is off and every edit and command allowed,
    for the caller's sandbox is what holds it. `files` are the project's files, for
    aider, which edits only the files it is given."""
    if tool == "codex":
        # Codex's sandbox needs namespaces of its own, which the caller's does not lend.
        return ["codex", "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", instruction]  # fmt: skip
    if tool == "claude":
        return ["claude", "-p", instruction, "--allowedTools", CLAUDE_TOOLS]
    if tool == "aider":
        chosen = "openai/" + _named(model, "aider")
        return ["aider", "--model", chosen, *shlex.split(AIDER_FLAGS), "--message", instruction,
                *files]  # fmt: skip
    if tool == "opencode":
        return ["opencode", "run", instruction]
    raise ValueError(f"unknown tool {tool!r}: one of {', '.join(TOOLS)}")


def config_for(tool: str, base_url: str, key: str, model: str | None) -> ToolConfig:
    """The configuration of `tool` (one of TOOLS) for a gateway, key and model (None:
    the tool's own default, for the tools that have one). The gateway's URL may be given
    with the `/v1` the demo prints: each tool adds what it needs itself."""
    try:
        make = TOOLS[tool]
    except KeyError:
        raise ValueError(f"unknown tool {tool!r}: one of {', '.join(TOOLS)}") from None
    root = base_url.rstrip("/").removesuffix("/v1")
    return make(root, key, model)
