"""What a coding agent's first request costs the gateway, against a chat request of the
same size (issue 25: at most 10 % more CPU).

    .venv/bin/python -m loadtest.bench_agent_request [--seconds 10] [--rounds 1]

One gateway (`--workers 1`, loadtest/bench-config) in front of the instant nginx
upstream, measured with wrk, the targets interleaved in each round:

- chat: one user message as long as the agent's whole request (no tools);
- chat with the agent's tools: the Messages request below as chat sends it (its system
  prompt a system message, its 20 tools function tools), which is what the Responses and
  Messages translations add to;
- Responses, as Codex CLI 0.171.0 sends it: its captured tool list (function tools, a
  `namespace` of them and `web_search`, tests/unit/api/codex_0.171.0_tools.json) and
  about 30 KB of instructions;
- Messages, as Claude Code sends it: 20 tools with JSON Schemas, a system prompt of about
  30 KB in blocks, `max_tokens: 32000` (clamped).

Prints requests/s, latency and the gateway's CPU per request; the agent's cost against
the chat request of the same size is the figure the issue asks for, and against chat
with the same tools, what the wire's translation costs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from loadtest.stack import bench_stack, interleaved, wrk_script

ROOT = Path(__file__).resolve().parent.parent
MODEL = "fake-llama-8b"
INSTRUCTIONS = 30_000


def _instructions() -> str:
    """About 30 KB of prose (this repository's docs), as an agent's instructions are."""
    prose = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    return prose[:INSTRUCTIONS]


def _tools(count: int) -> list[dict[str, Any]]:
    """`count` tools in Claude Code's shape: a name, a paragraph, a schema."""
    return [
        {
            "name": f"Tool{i}",
            "description": "Does one thing of a coding agent's work. " * 8,
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "An absolute path."},
                    "content": {"type": "string", "description": "What to write there."},
                    "mode": {"type": "string", "enum": ["create", "append", "replace"]},
                    "lines": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        }
        for i in range(count)
    ]


def bodies() -> dict[str, str]:
    text = _instructions()
    codex = json.loads((ROOT / "tests/unit/api/codex_0.171.0_tools.json").read_text())
    responses = {
        "model": MODEL,
        "instructions": text,
        "input": [{"type": "message", "role": "user", "content": "write hello.py"}],
        "tools": codex,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
        "max_output_tokens": 16,
    }
    messages = {
        "model": MODEL,
        "system": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "write hello.py"}],
        "tools": _tools(20),
        "max_tokens": 32000,
    }
    agent_bytes = max(len(json.dumps(responses)), len(json.dumps(messages)))
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": (text * 2)[:agent_bytes]}],
        "max_tokens": 16,
    }
    chat_tools = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": "write hello.py"},
        ],
        "tools": [
            {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["input_schema"]}}
            for t in messages["tools"]
        ],
        "max_tokens": 16,
    }  # fmt: skip
    return {
        "/v1/chat/completions (chat, same size)": json.dumps(chat),
        "/v1/chat/completions (chat, the agent's tools)": json.dumps(chat_tools),
        "/v1/responses (Codex CLI's tools)": json.dumps(responses),
        "/v1/messages (Claude Code's shape)": json.dumps(messages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    with bench_stack(1, "WARNING") as stack:
        targets = {
            name: (f"{stack.gateway_url}{name.split(' ')[0]}", wrk_script(body=body))
            for name, body in bodies().items()
        }
        results = interleaved(stack, targets, args.seconds, args.rounds)
    print("| request | c | requests/s | p50 ms | p99 ms | gateway CPU µs/request |")
    print("|---|---|---|---|---|---|")
    for (name, connections), runs in sorted(results.items(), key=lambda item: item[0][1]):
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99", "cpu_us")}
        print(
            f"| {name} | {connections} | {med['rps']:,.0f} | {med['p50']:.2f} | "
            f"{med['p99']:.2f} | {med['cpu_us']:,.0f} |"
        )


if __name__ == "__main__":
    main()
