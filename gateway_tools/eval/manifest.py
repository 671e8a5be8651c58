"""The manifest: everything a run depended on, so that it can be reproduced and compared.

Two runs compare when their `comparable` parts are equal: the same suite (its digest
and every task's), the same template (digest and version), the same sampling, attempts,
API, sandbox limits, concurrency and sanitization policy. Anything else (candidates,
prices, versions, the gateway's config) may differ and is shown.
"""

from __future__ import annotations

import dataclasses
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from gateway_tools.eval.suite import Suite

# Bumped when the record format or the judging changes: runs of two formats do not compare.
FORMAT_VERSION = 1
_SOURCE = Path(__file__).resolve().parents[2]


def build(
    *,
    suite: Suite,
    template: dict[str, str],
    settings: dict[str, Any],
    candidates: dict[str, dict[str, Any]],
    prices: dict[str, Any],
    outbound: dict[str, Any],
) -> dict[str, Any]:
    """A new run's manifest (`started_at` now, `finished_at` unset)."""
    return {
        "format_version": FORMAT_VERSION,
        "suite": {
            "name": suite.name,
            "version": suite.version,
            "path": str(suite.directory),
            "digest": suite.digest,
            "tasks": {
                task.id: {
                    "digest": task.digest,
                    "category": task.category,
                    "kind": task.kind,
                    "verified": False,  # checked in the sandbox: with_verified
                    "problem": task.problem,
                }
                for task in suite.tasks
            },
        },
        "template": template,
        "settings": settings,
        "outbound": outbound,
        "candidates": candidates,
        "prices": prices,
        "tool": {
            "name": "gateway eval",
            "version": _version(),
            "git_commit": _git_commit(),
            "python": platform.python_version(),
            "os": platform.platform(),
        },
        "started_at": _now(),
        "finished_at": None,
        "resumed_at": [],
    }


def with_verified(manifest: dict[str, Any], verified: dict[str, str | None]) -> dict[str, Any]:
    """The manifest with each task's verdict from the sandbox (None: it can judge answers)."""
    tasks = {
        task_id: {**entry, "verified": True, "problem": verified[task_id]}
        if task_id in verified
        else entry
        for task_id, entry in manifest["suite"]["tasks"].items()
    }
    return {**manifest, "suite": {**manifest["suite"], "tasks": tasks}}


def comparable(manifest: dict[str, Any]) -> dict[str, Any]:
    """The parts of a manifest that must be equal for two runs to compare."""
    suite = manifest.get("suite", {})
    return {
        "format_version": manifest.get("format_version"),
        "suite": suite.get("name"),
        "suite digest": suite.get("digest"),
        "tasks": {tid: t.get("digest") for tid, t in (suite.get("tasks") or {}).items()},
        "template": (manifest.get("template") or {}).get("name"),
        "template version": (manifest.get("template") or {}).get("version"),
        "template digest": (manifest.get("template") or {}).get("digest"),
        **{f"settings.{k}": v for k, v in sorted((manifest.get("settings") or {}).items())},
        "outbound policy": (manifest.get("outbound") or {}).get("policy"),
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each way in which two manifests are not comparable, named; empty when they are."""
    left, right = comparable(a), comparable(b)
    found = []
    for name in left.keys() | right.keys():
        if left.get(name) == right.get(name):
            continue
        if name == "tasks":
            found.extend(_task_differences(left.get(name) or {}, right.get(name) or {}))
        else:
            found.append(f"{name}: {left.get(name)!r} != {right.get(name)!r}")
    return sorted(found)


def tool_version_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Each candidate of both runs whose coding tool is not the same version in both:
    the tool brings its own prompts and loop, so its figures are the version's."""
    ca, cb = a.get("candidates") or {}, b.get("candidates") or {}
    found = []
    for name in sorted(ca.keys() & cb.keys()):
        va, vb = (ca[name] or {}).get("tool_version"), (cb[name] or {}).get("tool_version")
        if va != vb:
            found.append(f"candidate {name}: tool version {va!r} != {vb!r}")
    return found


def _task_differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    found = [f"task {t}: only in the first run" for t in sorted(a.keys() - b.keys())]
    found += [f"task {t}: only in the second run" for t in sorted(b.keys() - a.keys())]
    found += [f"task {t}: content differs" for t in sorted(a.keys() & b.keys()) if a[t] != b[t]]
    return found


def settings_of(**values: Any) -> dict[str, Any]:
    """Settings as plain JSON values (dataclasses as dicts)."""
    return {
        key: dataclasses.asdict(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type)
        else value
        for key, value in values.items()
    }


def finished(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "finished_at": _now()}


def resumed(manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        **manifest,
        "resumed_at": [*manifest.get("resumed_at", []), _now()],
        "finished_at": None,
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _version() -> str:
    try:
        return metadata.version("inference-gateway")
    except metadata.PackageNotFoundError:
        return "unknown"


def _git_commit() -> str | None:
    """The source tree's commit (with `+dirty` when it has changes), if it is a checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_SOURCE, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=_SOURCE, capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
