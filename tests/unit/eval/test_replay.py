"""The demo's scripted models: recordings current with the suite, replayed as recorded."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway_tools.dev.replay import DONE, REPLAY_DIR, ROOT, main
from gateway_tools.dev.sim.model_template import replay_pieces
from gateway_tools.eval.suite import load_suite

SUITE = load_suite(ROOT / "evals" / "suites" / "gateway-python")


def test_the_recorded_answers_are_current_with_the_suite_and_the_script() -> None:
    # A task or script.yaml changed without `python -m gateway_tools.dev.replay` fails here.
    assert main(["--check"]) == 0


def test_a_prompt_holding_a_tasks_instruction_gets_that_tasks_answer() -> None:
    recordings = json.loads((REPLAY_DIR / "coder-large.json").read_text())
    for recording in [r for r in recordings["recordings"] if "tool" not in r]:
        prompt = f"<|im_start|>user\n# Ticket\n\n{recording['match']}\n\n# The project".encode()
        replay = replay_pieces(prompt, recordings, max_tokens=4096)
        assert "".join(replay.pieces) == recording["answer"], recording["task"]
        assert replay.first_token_delay == recording.get("first_token_delay_s", 0.0)
        # Four bytes a token, as the simulator counts its input.
        assert sum(replay.tokens) == sum(-(-len(p) // 4) for p in replay.pieces)


def test_max_tokens_cuts_a_replayed_answer() -> None:
    recordings = json.loads((REPLAY_DIR / "coder-small.json").read_text())
    first = next(r for r in recordings["recordings"] if "tool" not in r)
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


def tool_answer(model: str, marker: str, task_id: str, after_a_call: bool = False) -> str:
    recordings = json.loads((REPLAY_DIR / f"{model}.json").read_text())
    task = next(t for t in SUITE.tasks if t.id == task_id)
    prompt = f"<tools>{marker}</tools>\n<|im_start|>user\n{task.instruction}<|im_end|>"
    if after_a_call:
        prompt += "\n<tool_response>\n</tool_response>"
    return "".join(replay_pieces(prompt.encode(), recordings, max_tokens=4096).pieces)


def call_of(answer: str) -> dict[str, Any]:
    call: dict[str, Any] = json.loads(
        answer.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    )
    return call


def written_by(script: str, task_id: str, tmp_path: Path) -> dict[str, str]:
    """The task's expected files after `script` ran in a copy of its snapshot."""
    task = next(t for t in SUITE.tasks if t.id == task_id)
    work = tmp_path / "task"
    shutil.copytree(task.snapshot_directory, work)
    subprocess.run(["bash", "-c", script], cwd=work, check=True)
    return {path: (work / path).read_text() for path in task.expected_files}


def solution(task_id: str) -> dict[str, str]:
    task = next(t for t in SUITE.tasks if t.id == task_id)
    return {path: (task.solution_directory / path).read_text() for path in task.expected_files}


# A cross-file task (a new module, and its callers changed), on the two models' tools.
CROSS = "13-shared-error-body"


@pytest.mark.parametrize(
    ("marker", "name", "argument"),
    [('"exec_command"', "exec_command", "cmd"), ('"Write"', "Bash", "command"),
     ("You are opencode", "bash", "command")],
)  # fmt: skip
def test_each_tool_is_answered_with_its_own_shell_call_that_writes_the_solution(
    marker: str, name: str, argument: str, tmp_path: Path
) -> None:
    call = call_of(tool_answer("coder-large", marker, CROSS))
    assert call["name"] == name
    assert written_by(call["arguments"][argument], CROSS, tmp_path) == solution(CROSS)
    # Once the call's result is in, the last word.
    assert tool_answer("coder-large", marker, CROSS, after_a_call=True) == DONE


def test_codex_with_a_model_it_knows_gets_its_javascript_exec_call() -> None:
    call = call_of(tool_answer("coder-large", '"functions__exec"', CROSS))
    assert call["name"] == "functions__exec"
    code = call["arguments"]["input"]
    script = json.loads(code.removeprefix("await tools.exec_command({cmd: ").removesuffix("});"))
    assert (
        script == call_of(tool_answer("coder-large", '"exec_command"', CROSS))["arguments"]["cmd"]
    )


def test_aider_gets_whole_files_in_its_listing_format() -> None:
    answer = tool_answer("coder-large", "*file listing*", "01-token-bucket-refill")
    ((path, text),) = solution("01-token-bucket-refill").items()
    assert answer == f"{path}\n```\n{text.rstrip()}\n```\n"


def test_a_wrong_answer_writes_the_snapshot_back_and_the_tools_differ(tmp_path: Path) -> None:
    task = next(t for t in SUITE.tasks if t.id == "03-lru-cache-recency")
    codex = call_of(tool_answer("coder-small", '"exec_command"', task.id))["arguments"]["cmd"]
    claude = call_of(tool_answer("coder-small", '"Write"', task.id))["arguments"]["command"]
    snapshot = dict(task.snapshot)
    assert written_by(codex, task.id, tmp_path / "codex") == {
        path: snapshot[path] for path in task.expected_files
    }
    assert written_by(claude, task.id, tmp_path / "claude") == solution(task.id)


def test_a_looping_answer_never_says_it_is_done() -> None:
    task = "15-injectable-cache-clock"
    first = call_of(tool_answer("coder-small", '"exec_command"', task))
    again = call_of(tool_answer("coder-small", '"exec_command"', task, after_a_call=True))
    assert first == again == {"name": "exec_command", "arguments": {"cmd": "ls"}}
