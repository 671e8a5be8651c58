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

    python -m gateway.dev.replay            # rewrite evals/replay/<model>.json
    python -m gateway.dev.replay --check    # fail if they are not what the script makes
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.eval.suite import Task, load_suite

ROOT = Path(__file__).resolve().parents[2]
REPLAY_DIR = ROOT / "evals" / "replay"
SCRIPT = REPLAY_DIR / "script.yaml"
SLOW_FIRST_TOKEN_S = 4.0
REFUSAL = "I'm sorry, but I can't help with changing this code."
UNMATCHED = "I have no recorded answer for this prompt."
_PASSING = ("right", "right-diff", "slow")


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
        files[model] = {"suite": suite.name, "recordings": entries, "unmatched": UNMATCHED}
    return files


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
    parser = argparse.ArgumentParser(prog="python -m gateway.dev.replay", description=__doc__)
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
        print(f"stale: {', '.join(stale)}: run python -m gateway.dev.replay", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
