"""`gateway eval compare DIR_A DIR_B`: two runs side by side, only when they compare.

Two runs compare when their manifests agree on everything a figure depends on: the
suite and each task, the prompt template, the sampling and the other settings, the
sanitization policy (`manifest.differences`). Otherwise `compare` refuses, naming each
difference. What may differ (the candidates, their prices and config versions, the
tool's version) is shown above the figures, so that a change there is not mistaken
for a change in the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_tools.eval import manifest, records, scoring
from gateway_tools.eval.reporting import ROWS, delta, show
from gateway_tools.eval.scoring import Figures


class NotComparable(Exception):
    """The two runs differ in what their figures depend on."""

    def __init__(self, differences: list[str]) -> None:
        super().__init__("the runs are not comparable; they differ in:\n" + "\n".join(differences))
        self.differences = differences


def compare(a: Path, b: Path, *, other_tool_versions: bool = False) -> str:
    """The figures of runs `a` and `b` side by side, per candidate, with the change from
    a to b, as Markdown. NotComparable (each difference named) when they do not compare:
    also when a coding tool of both runs is not the same version in both, unless
    `other_tool_versions` (the difference is then shown above the figures)."""
    ma, mb = records.read_manifest(a), records.read_manifest(b)
    found = manifest.differences(ma, mb)
    if not other_tool_versions:
        found += manifest.tool_version_differences(ma, mb)
    if found:
        raise NotComparable(found)
    fa = scoring.figures(records.read_attempts(a), ma)
    fb = scoring.figures(records.read_attempts(b), mb)
    sections = [_header(a, b, ma, mb), *_candidates(fa, fb, ma, mb)]
    return "\n\n".join(sections) + "\n"


def _header(a: Path, b: Path, ma: dict[str, Any], mb: dict[str, Any]) -> str:
    suite, template = ma.get("suite") or {}, ma.get("template") or {}
    lines = [
        "# gateway eval compare",
        "",
        f"A: `{a}`  ",
        f"B: `{b}`",
        "",
        f"Comparable: the same suite ({suite.get('name')} v{suite.get('version')}, digest "
        f"`{str(suite.get('digest'))[:12]}`), template ({template.get('name')} "
        f"v{template.get('version')}, digest `{str(template.get('digest'))[:12]}`), "
        "settings and sanitization policy.",
        "",
        "| | A | B |",
        "|---|---|---|",
        f"| started | {ma.get('started_at')} | {mb.get('started_at')} |",
        f"| finished | {_finished(ma)} | {_finished(mb)} |",
    ]
    shown = _allowed_differences(ma, mb)
    if shown:
        lines += ["", "Different, without preventing the comparison:", ""]
        lines += [f"- {item}" for item in shown]
    return "\n".join(lines)


def _finished(m: dict[str, Any]) -> str:
    return str(m["finished_at"]) if m.get("finished_at") else "**incomplete run**"


def _allowed_differences(ma: dict[str, Any], mb: dict[str, Any]) -> list[str]:
    """What differs between the runs outside `manifest.comparable`, named."""
    found = []
    ta, tb = ma.get("tool") or {}, mb.get("tool") or {}
    for key in ("version", "git_commit", "python", "os"):
        if ta.get(key) != tb.get(key):
            found.append(f"tool {key}: {ta.get(key)} (A), {tb.get(key)} (B)")
    pa, pb = ma.get("prices") or {}, mb.get("prices") or {}
    for key in ("currency", "manual_correction"):
        if pa.get(key) != pb.get(key):
            found.append(f"prices {key}: {pa.get(key)} (A), {pb.get(key)} (B)")
    ca, cb = ma.get("candidates") or {}, mb.get("candidates") or {}
    models_a, models_b = pa.get("models") or {}, pb.get("models") or {}
    for name in [*ca, *(n for n in cb if n not in ca)]:
        if name not in cb or name not in ca:
            found.append(f"candidate {name}: only in run {'A' if name in ca else 'B'}")
            continue
        tool_a, tool_b = (ca[name] or {}).get("tool_version"), (cb[name] or {}).get("tool_version")
        if tool_a != tool_b:
            found.append(f"candidate {name}: tool version {tool_a} (A), {tool_b} (B)")
        version_a = (ca[name] or {}).get("config_version")
        version_b = (cb[name] or {}).get("config_version")
        if version_a != version_b:
            found.append(f"candidate {name}: config version {version_a} (A), {version_b} (B)")
        if models_a.get(name) != models_b.get(name):
            found.append(
                f"candidate {name}: price {models_a.get(name)} (A), {models_b.get(name)} (B)"
            )
    return found


def _candidates(
    fa: dict[str, Figures], fb: dict[str, Figures], ma: dict[str, Any], mb: dict[str, Any]
) -> list[str]:
    currency_a = str((ma.get("prices") or {}).get("currency", "USD"))
    currency_b = str((mb.get("prices") or {}).get("currency", "USD"))
    sections = []
    for name in [*fa, *(n for n in fb if n not in fa)]:
        a, b = fa.get(name), fb.get(name)
        lines = [f"## {name}", ""]
        if a is None or b is None:
            lines.append(f"Only in run {'A' if a is not None else 'B'}: nothing to compare.")
            sections.append("\n".join(lines))
            continue
        lines += ["| dimension | figure | A | B | change |", "|---|---|---|---|---|"]
        for row in ROWS:
            if row.unit == "cost" and currency_a != currency_b:
                change = "different currencies"
            else:
                change = delta(row, row.get(a), row.get(b), currency_a)
            lines.append(
                f"| {row.dimension} | {row.label} | {show(row, a, currency_a)} | "
                f"{show(row, b, currency_b)} | {change} |"
            )
        sections.append("\n".join(lines))
    return sections
