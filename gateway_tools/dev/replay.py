"""Recorded answers for the demo's scripted coding models (a fixture, not a model).

The simulated LLMs cannot write code, so `gateway eval` could not be shown end to end
through the real gateway. Instead, two models of the demo (`coder-large`,
`coder-small`) replay answers recorded here for the shipped suite: `script.yaml` says
which kind of answer each gives to each task, and this module writes the answers:

- `right`: the reference solution, as whole files;
- `right-diff`: the reference solution, as a unified diff of the snapshot;
- `slow`: `right`, after a long wait for the first token;
- `wrong`: the snapshot's own files back, unchanged (the hidden tests fail);
- `broken-diff`: a diff whose context is not in the file (it does not apply);
- `refused`: a refusal, with neither files nor a diff.

Each recording also says what `gateway eval` must find (`expect`), which the tests
check exactly. The model matches a recording by the task's instruction in the prompt:
the harness sends ordinary prompts and knows nothing of this.

The same models answer the real coding tools (`gateway eval run --tool`), each in the
tool's own way, as the script's `tools` section says per model, tool and task:

- `right`: the reference solution written by the tool's shell (Codex CLI's
  `exec_command`, Claude Code's `Bash`, opencode's `bash`: one heredoc per file), or
  as whole files in aider's edit format; then, once the tool's result is in the
  prompt, a last word;
- `wrong`: the same calls writing the snapshot's own files back (the tests fail);
- `loop`: a harmless command (`ls`) called again on every turn, never a last word:
  the tool runs until the evaluation stops it.

A tool's recordings match on a string only its prompts hold (its tool names), and come
before the direct answers, which match on the instruction alone.

    python -m gateway_tools.dev.replay            # rewrite evals/replay/<model>.json
    python -m gateway_tools.dev.replay --check    # fail if they are not what the script makes
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway_tools.eval.suite import Task, load_suite

ROOT = Path(__file__).resolve().parents[2]
REPLAY_DIR = ROOT / "evals" / "replay"
SCRIPT = REPLAY_DIR / "script.yaml"
SLOW_FIRST_TOKEN_S = 4.0
REFUSAL = "I'm sorry, but I can't help with changing this code."
UNMATCHED = "I have no recorded answer for this prompt."
_PASSING = ("right", "right-diff", "slow")
DONE = "I made the change; the tests should pass now."
# Where a heredoc ends: a line no file of the suite holds.
HEREDOC_END = "GATEWAY_EVAL_EOF"
# Per tool, the strings its prompts hold (a tool call's name in its tool list) and how
# it is told to write files. Codex with a model it knows calls a JavaScript `exec`
# tool in place of exec_command; opencode names its session by a call of its own
# first; aider calls no tools. The order is the match order.
TOOL_MARKERS: dict[str, list[tuple[str, str]]] = {
    "codex": [('"functions__exec"', "codex-js"), ('"exec_command"', "codex")],
    "claude": [('"Write"', "claude")],
    "opencode": [("You are opencode", "opencode")],
    "aider": [("*file listing*", "aider")],
}
TITLE_MARKER = "You are a title generator"


def recordings(script: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The replay file's content for each model of the script."""
    suite = load_suite(ROOT / script["suite"])
    files = {}
    for model, plan in script["models"].items():
        kinds = plan.get("tasks") or {}
        unknown = sorted(set(kinds) - {task.id for task in suite.tasks})
        if unknown:
            raise ValueError(f"{SCRIPT}: {model}: no such tasks in the suite: {unknown}")
        entries = [_recording(task, kinds.get(task.id, plan["default"])) for task in suite.tasks]
        tool_plans = (script.get("tools") or {}).get(model) or {}
        tools = [_tool_recordings(suite.tasks, tool, tool_plans[tool]) for tool in TOOL_MARKERS]
        files[model] = {
            "suite": suite.name,
            "recordings": [entry for tool in tools for entry in tool] + entries,
            "unmatched": UNMATCHED,
        }
    return files


def _tool_recordings(
    tasks: Sequence[Task], tool: str, plan: dict[str, Any]
) -> list[dict[str, Any]]:
    """A tool's recordings for every task: per task, its last word (once a tool result is
    in the prompt; none for `loop`) before its first turn."""
    kinds = plan.get("tasks") or {}
    unknown = sorted(set(kinds) - {task.id for task in tasks})
    if unknown:
        raise ValueError(f"{SCRIPT}: {tool}: no such tasks in the suite: {unknown}")
    entries: list[dict[str, Any]] = []
    if tool == "opencode":
        entries.append({"tool": tool, "task": "title", "match": TITLE_MARKER, "answer": "A change"})
    for task in tasks:
        kind = kinds.get(task.id, plan["default"])
        for marker, dialect in TOOL_MARKERS[tool]:
            common = {
                "tool": tool,
                "task": task.id,
                "kind": kind,
                "expect": _expected(kind),
                "match": task.instruction,
            }
            if kind != "loop" and dialect != "aider":
                last_word = {"match_all": [marker, "<tool_response>"], "answer": DONE}
                entries.append({**common, **last_word})
            first = {"match_all": [marker], "answer": _tool_answer(task, kind, dialect)}
            entries.append({**common, **first})
    return entries


def _expected(kind: str) -> str:
    if kind not in ("right", "wrong", "loop"):
        raise ValueError(f"{SCRIPT}: unknown tool answer kind {kind!r}")
    return "pass" if kind == "right" else "fail"


def _tool_answer(task: Task, kind: str, dialect: str) -> str:
    """The first turn's answer: the files written the tool's way."""
    snapshot = dict(task.snapshot)
    files = {
        path: (task.solution_directory / path).read_text()
        if kind == "right"
        else snapshot.get(path, "")
        for path in task.expected_files
    }
    if dialect == "aider":
        return "\n".join(f"{path}\n```\n{text.rstrip()}\n```\n" for path, text in files.items())
    script = "ls" if kind == "loop" else _heredocs(files)
    if dialect == "codex-js":
        return _tool_call(
            "functions__exec",
            {"input": f"await tools.exec_command({{cmd: {json.dumps(script)}}});"},
        )
    if dialect == "codex":
        return _tool_call("exec_command", {"cmd": script})
    name = "Bash" if dialect == "claude" else "bash"
    return _tool_call(name, {"command": script, "description": "Write the changed files"})


def _heredocs(files: dict[str, str]) -> str:
    """A shell script that writes each file whole (its directory made first)."""
    lines = []
    for path, text in files.items():
        folder = str(Path(path).parent)
        if folder != ".":
            lines.append(f"mkdir -p '{folder}'")
        lines.append(f"cat > '{path}' <<'{HEREDOC_END}'\n{text.rstrip(chr(10))}\n{HEREDOC_END}")
    return "\n".join(lines) + "\n"


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _recording(task: Task, kind: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "task": task.id,
        "kind": kind,
        "expect": "pass" if kind in _PASSING else "fail",
        "match": task.instruction,
        "answer": _answer(task, kind),
    }
    if kind == "slow":
        entry["first_token_delay_s"] = SLOW_FIRST_TOKEN_S
    return entry


def _answer(task: Task, kind: str) -> str:
    snapshot = dict(task.snapshot)
    solution = {path: (task.solution_directory / path).read_text() for path in task.expected_files}
    if kind in ("right", "slow"):
        return _as_files(solution)
    if kind == "wrong":
        return _as_files({path: snapshot.get(path, "") for path in solution})
    if kind == "right-diff":
        return "```diff\n" + _diff(snapshot, solution) + "```\n"
    if kind == "broken-diff":
        stale = {
            path: "# an older version of this file\n" + text for path, text in snapshot.items()
        }
        return "```diff\n" + _diff(stale, solution) + "```\n"
    if kind == "refused":
        return REFUSAL
    raise ValueError(f"{SCRIPT}: unknown answer kind {kind!r}")


def _as_files(files: dict[str, str]) -> str:
    return "\n".join(
        f"FILE: {path}\n```python\n{text.rstrip()}\n```\n" for path, text in files.items()
    )


def _diff(before: dict[str, str], after: dict[str, str]) -> str:
    parts = []
    for path, text in after.items():
        old = before.get(path)
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"a/{path}" if old is not None else "/dev/null",
            tofile=f"b/{path}",
        )
        parts.append("".join(lines))
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway_tools.dev.replay", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check the files are current")
    args = parser.parse_args(argv)
    script = yaml.safe_load(SCRIPT.read_text())
    stale = []
    for model, content in recordings(script).items():
        path = REPLAY_DIR / f"{model}.json"
        text = json.dumps(content, indent=1) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}: run python -m gateway_tools.dev.replay", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
