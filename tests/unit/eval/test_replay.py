"""The demo's scripted models: recordings current with the suite, replayed as recorded."""

from __future__ import annotations

import json

from gateway.dev.replay import REPLAY_DIR, main
from gateway.dev.sim.model_template import replay_pieces


def test_the_recorded_answers_are_current_with_the_suite_and_the_script() -> None:
    # A task or script.yaml changed without `python -m gateway.dev.replay` fails here.
    assert main(["--check"]) == 0


def test_a_prompt_holding_a_tasks_instruction_gets_that_tasks_answer() -> None:
    recordings = json.loads((REPLAY_DIR / "coder-large.json").read_text())
    for recording in recordings["recordings"]:
        prompt = f"<|im_start|>user\n# Ticket\n\n{recording['match']}\n\n# The project".encode()
        replay = replay_pieces(prompt, recordings, max_tokens=4096)
        assert "".join(replay.pieces) == recording["answer"], recording["task"]
        assert replay.first_token_delay == recording.get("first_token_delay_s", 0.0)
        # Four bytes a token, as the simulator counts its input.
        assert sum(replay.tokens) == sum(-(-len(p) // 4) for p in replay.pieces)


def test_max_tokens_cuts_a_replayed_answer() -> None:
    recordings = json.loads((REPLAY_DIR / "coder-small.json").read_text())
    first = recordings["recordings"][0]
    replay = replay_pieces(first["match"].encode(), recordings, max_tokens=10)
    assert sum(replay.tokens) == 10
    assert "".join(replay.pieces) == first["answer"][:40]


def test_an_unknown_prompt_gets_the_unmatched_text() -> None:
    recordings = json.loads((REPLAY_DIR / "coder-small.json").read_text())
    replay = replay_pieces(b"write me a poem", recordings, max_tokens=100)
    assert "".join(replay.pieces) == recordings["unmatched"]


AGENT = "write hello.py that prints hi"


def agent_answer(prompt: str) -> str:
    recordings = json.loads((REPLAY_DIR / "agent.json").read_text())
    return "".join(replay_pieces(prompt.encode(), recordings, max_tokens=4096).pieces)


def test_the_scripted_agent_calls_each_tool_s_own_way_to_write_a_file() -> None:
    codex = agent_answer(f'<tools>{{"name": "exec_command"}}</tools> user: {AGENT}')
    call = json.loads(codex.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call == {
        "name": "exec_command",
        "arguments": {"cmd": "printf 'print(\"hi\")\\n' > hello.py"},
    }
    claude = agent_answer(
        f'<tools>{{"name": "Write"}}</tools> Primary working directory: /tmp/w-1\n user: {AGENT}'
    )
    call = json.loads(claude.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["arguments"] == {"file_path": "/tmp/w-1/hello.py", "content": "print('hi')\n"}


def test_the_scripted_agent_ends_once_the_tool_s_result_is_in() -> None:
    prompt = f'<tools>{{"name": "Write"}}</tools> {AGENT} <tool_response>ok</tool_response>'
    assert agent_answer(prompt) == "I wrote hello.py; it prints hi."
    assert agent_answer("something else") == "I have no recorded answer for this prompt."
