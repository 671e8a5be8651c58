"""`gateway eval report DIR`: a run's Markdown report and PNG charts, from the run directory.

The report reads only what the run left (manifest.json, attempts.jsonl), the profiles it
is given and the reviewer records. It writes DIR/report/report.md and three charts next
to it: pass rate against cost per completed task, TTFT per candidate, and pass rate by
task category. Every weighted score is shown next to the figures it was made from, and
every dimension that has no data says so rather than showing a zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_tools.eval import records, scoring
from gateway_tools.eval.records import Attempt
from gateway_tools.eval.reviews import Review, load_reviews
from gateway_tools.eval.scoring import Figures, Profile, Rate, WeightedScore

REPORT_DIR = "report"
REPORT_FILE = "report.md"
COST_CHART = "pass_rate_vs_cost.png"
TTFT_CHART = "ttft.png"
CATEGORY_CHART = "pass_rate_by_category.png"
NOT_MEASURED = "not measured"
NO_PRICE = "no price"
NOT_REVIEWED = "not reviewed"
NO_VALUE = "-"  # a cell that has nothing to show (no change, no attempt)
_DIGEST_SHOWN = 12  # enough hex digits to tell two digests apart by eye
_REASON_SHOWN = 200


# --- the figures, as rows: shared with `compare` ------------------------------------------

Value = Rate | float | int | None


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of the per-dimension table: `unit` is "%" (a Rate), "s", "cost", "n"
    (a count) or "x" (a mean count)."""

    dimension: str
    label: str
    unit: str
    get: Callable[[Figures], Value]


ROWS: tuple[Row, ...] = (
    Row("correctness", "pass rate", "%", lambda f: f.correctness),
    Row("context", "pass rate on cross-file tasks", "%", lambda f: f.context),
    Row("context", "answers touching exactly the expected files", "%", lambda f: f.expected_files),
    Row("speed", "time to first token, p50", "s", lambda f: f.ttft_p50_s),
    Row("speed", "time to first token, p95", "s", lambda f: f.ttft_p95_s),
    Row(
        "speed", "time to complete answer (a tool: to its exit), p50", "s", lambda f: f.total_p50_s
    ),
    Row(
        "speed", "time to complete answer (a tool: to its exit), p95", "s", lambda f: f.total_p95_s
    ),
    Row("speed", "attempts answered", "n", lambda f: f.answered),
    Row(
        "cost",
        "cost per completed task (with manual corrections)",
        "cost",
        lambda f: f.cost_per_task,
    ),
    Row("cost", "token cost per passed attempt", "cost", lambda f: f.token_cost_per_pass),
    Row("cost", "token cost, all attempts", "cost", lambda f: f.token_cost),
    Row("cost", "tokens in", "n", lambda f: f.tokens_in),
    Row("cost", "tokens out", "n", lambda f: f.tokens_out),
    Row("cost", "cached prompt tokens (of tokens in)", "n", lambda f: f.cached_tokens),
    Row("cost", "model calls (the gateway's records)", "n", lambda f: f.calls),
    Row(
        "cost",
        "model calls per attempt",
        "x",
        lambda f: f.calls / f.attempts if f.attempts else None,
    ),
    Row("stability", "error rate (attempts ending on an upstream error)", "%", lambda f: f.errors),
    Row("stability", "refusals (429 and 503, of requests sent)", "%", lambda f: f.refusals),
    Row("stability", "retries", "n", lambda f: f.retries),
    Row("stability", "5xx responses", "n", lambda f: f.status_5xx),
    Row("stability", "connection errors", "n", lambda f: f.connection_errors),
    Row("stability", "answers from a fallback model", "n", lambda f: f.fallbacks),
    Row(
        "stability",
        "tool runs gone wrong (not installed, stopped, exited)",
        "%",
        lambda f: f.tool_failures,
    ),
    Row("(run)", "attempts judged", "n", lambda f: f.attempts),
    Row("(run)", "attempts at malformed tasks (in no figure)", "n", lambda f: f.malformed),
)


def number(value: Value) -> float | None:
    """A row's value as a plain number (a Rate's share), None when it has none."""
    if isinstance(value, Rate):
        return value.value
    return None if value is None else float(value)


def show(row: Row, figures: Figures, currency: str) -> str:
    """A row's value for one candidate, with its unit (and why, when there is none)."""
    value = row.get(figures)
    if row.unit == "cost" and not figures.priced:
        return NO_PRICE
    if isinstance(value, Rate):
        return (
            f"{percent(value.value)} ({value.hits}/{value.total})" if value.total else NOT_MEASURED
        )
    if value is None:
        return NOT_MEASURED
    if row.unit == "s":
        return seconds(float(value))
    if row.unit == "cost":
        return money(float(value), currency)
    if row.unit == "x":
        return f"{float(value):.1f}"
    return f"{int(value):,}"


def delta(row: Row, a: Value, b: Value, currency: str) -> str:
    """The change from `a` to `b` in the row's unit (NO_VALUE when either has none)."""
    left, right = number(a), number(b)
    if left is None or right is None:
        return NO_VALUE
    change = right - left
    if row.unit == "%":
        return f"{change * 100:+.1f} pp"
    if row.unit == "s":
        return f"{change:+.2f} s"
    if row.unit == "cost":
        return f"{'+' if change >= 0 else '-'}{money(abs(change), currency)}"
    if row.unit == "x":
        return f"{change:+.1f}"
    return f"{int(change):+,}"


def percent(value: float | None) -> str:
    return NOT_MEASURED if value is None else f"{value * 100:.1f} %"


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def money(value: float, currency: str) -> str:
    # Token costs of one attempt are fractions of a cent; corrections are whole amounts.
    if value == 0:
        return f"0 {currency}"
    if abs(value) >= 1:
        return f"{value:,.2f} {currency}"
    if abs(value) < 0.0001:
        return f"< 0.0001 {currency}"
    return f"{value:.4f} {currency}"


def score_text(value: float | None) -> str:
    return NO_VALUE if value is None else f"{value:.2f}"


# --- the report ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Run:
    """Everything the report is made of."""

    directory: Path
    manifest: dict[str, Any]
    attempts: list[Attempt]
    figures: dict[str, Figures]
    profiles: list[Profile]
    reviews: dict[str, Review]
    reviews_note: str | None  # why there are no records, when there are none
    scores: dict[str, dict[str, WeightedScore]]  # candidate -> profile -> score

    @property
    def currency(self) -> str:
        return str((self.manifest.get("prices") or {}).get("currency", "USD"))


def write_report(run_dir: Path, profiles: list[Path], reviews_dir: Path | None) -> Path:
    """Write `run_dir/report/report.md` and its PNG charts; returns the Markdown's path.
    ValueError (naming the file) on a run directory, profile or review that cannot be read."""
    manifest = records.read_manifest(run_dir)
    attempts = records.read_attempts(run_dir)
    reviews, note = _reviews(reviews_dir)
    loaded = [scoring.load_profile(path) for path in profiles]
    figures = scoring.figures(attempts, manifest)
    scores = {
        name: {p.name: scoring.weighted_score(f, p, reviews.get(name)) for p in loaded}
        for name, f in figures.items()
    }
    run = _Run(run_dir, manifest, attempts, figures, loaded, reviews, note, scores)
    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    write_charts(out, attempts, figures, run.currency)
    path = out / REPORT_FILE
    path.write_text(_render(run))
    return path


def _reviews(directory: Path | None) -> tuple[dict[str, Review], str | None]:
    if directory is None:
        return {}, "no directory of reviewer records was given"
    if not directory.exists():
        # The CLI's default directory may be absent where the report is made: say so.
        return {}, f"{directory} does not exist"
    return load_reviews(directory), None


def _render(run: _Run) -> str:
    """The report's Markdown."""
    sections = [
        _header(run),
        _dimensions(run),
        _weighted(run),
        _not_measured(run),
        _charts_section(),
        _per_task(run),
        _failures(run),
        _reviewer_records(run),
    ]
    return "\n\n".join(s.rstrip() for s in sections if s) + "\n"


def _header(run: _Run) -> str:
    m = run.manifest
    suite, template = m.get("suite") or {}, m.get("template") or {}
    settings, tool = m.get("settings") or {}, m.get("tool") or {}
    prices = m.get("prices") or {}
    lines = [f"# gateway eval report: {suite.get('name', '?')} v{suite.get('version', '?')}", ""]
    if m.get("finished_at") is None:
        lines += [
            "> **This run is incomplete**: it has no finish time (interrupted, or still "
            "running). The figures cover only the attempts recorded so far; run the same "
            "command again to resume it.",
            "",
        ]
    rows = [
        ("run directory", f"`{run.directory}`"),
        ("suite", f"{suite.get('name')} v{suite.get('version')}, "
                  f"digest `{_short(suite.get('digest'))}`, {len(suite.get('tasks') or {})} tasks"),
        ("prompt template", f"{template.get('name')} v{template.get('version')}, "
                            f"digest `{_short(template.get('digest'))}`"),
        ("sampling", _mapping_text(settings.get("sampling"))),
        ("attempts per task", str(settings.get("attempts", "?"))),
        ("concurrency", str(settings.get("concurrency", "?"))),
        ("API, retries", f"{settings.get('api', '?')}, "
                         f"at most {settings.get('max_retries', '?')} retries per attempt"),
        ("sandbox limits", _mapping_text(settings.get("sandbox"))),
        ("outbound sanitization", _outbound(m.get("outbound"))),
        ("prices", f"{prices.get('currency', 'USD')}; manual correction "
                   f"{prices.get('manual_correction', 0)} per failed attempt"),
        ("candidates", _candidates(m.get("candidates"))),
        ("tool", f"{tool.get('name', 'gateway eval')} {tool.get('version', '?')}, "
                 f"commit `{tool.get('git_commit') or 'unknown'}`"),
        ("Python, OS", f"{tool.get('python', '?')}, {tool.get('os', '?')}"),
        ("started", str(m.get("started_at") or "?")),
        ("finished", str(m.get("finished_at") or "not finished (incomplete run)")),
    ]  # fmt: skip
    if settings.get("tool_sandbox"):
        # The tools bring their own prompts, sampling and retries (the last are counted
        # under stability); the run's settings for these were never sent.
        own = "each tool's own (set by the tool, not by gateway eval)"
        direct_only = ("prompt template", "sampling", "API, retries")
        rows = [(name, own if name in direct_only else value) for name, value in rows]
        rows[8:8] = [
            ("coding tools' sandbox", _mapping_text(settings["tool_sandbox"])),
            ("coding tools' keys", f"tenant {settings.get('tool_tenant')}, one key a run, "
                                   f"{settings.get('tool_run_requests_per_minute') or 'no'} "
                                   "requests a minute of its own"),
        ]  # fmt: skip
    if m.get("resumed_at"):
        rows.append(("resumed", ", ".join(map(str, m["resumed_at"]))))
    lines += ["| | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in rows)]
    return "\n".join(lines)


def _outbound(outbound: Any) -> str:
    if not isinstance(outbound, dict) or not outbound.get("policy"):
        return "not recorded in the manifest"
    text = f"policy: {outbound['policy']}"
    if outbound.get("applied_by"):
        text += f" (applied by {outbound['applied_by']})"
    if outbound.get("internal_domains"):
        text += f"; internal domains: {', '.join(map(str, outbound['internal_domains']))}"
    return text


def _candidates(candidates: Any) -> str:
    if not isinstance(candidates, dict) or not candidates:
        return "none recorded"
    parts = []
    for name, info in candidates.items():
        details = []
        if isinstance(info, dict):
            if info.get("tool"):
                details.append(f"{info['tool']} {info.get('tool_version') or 'not installed'}"
                               f" on {info.get('model')}")  # fmt: skip
            if info.get("config_version"):
                details.append(f"config version {info['config_version']}")
            if info.get("owned_by"):
                details.append(f"owned by {info['owned_by']}")
            if info.get("listed") is False:
                details.append("not listed by the endpoint")
        parts.append(f"{name} ({', '.join(details)})" if details else str(name))
    return "; ".join(parts)


def _dimensions(run: _Run) -> str:
    names = list(run.figures)
    if not names:
        return "## Figures\n\nNo attempt is recorded: nothing was measured."
    lines = [
        "## Figures per dimension",
        "",
        "Attempts at malformed tasks are left out of every figure. Data security and "
        "integration are reviewer records (below), not measurements.",
        "",
        f"| dimension | figure | {' | '.join(names)} |",
        f"|---|---|{'---|' * len(names)}",
    ]
    for row in ROWS:
        cells = [show(row, run.figures[name], run.currency) for name in names]
        lines.append(f"| {row.dimension} | {row.label} | {' | '.join(cells)} |")
    for dimension, attribute in (("security", "data_security"), ("integration", "integration")):
        cells = []
        for name in names:
            review = run.reviews.get(name)
            section = getattr(review, attribute) if review is not None else None
            cells.append(f"{section.score:g}/5 (reviewer)" if section is not None else NOT_REVIEWED)
        lines.append(f"| {dimension} | reviewer's score | {' | '.join(cells)} |")
    return "\n".join(lines)


def _weighted(run: _Run) -> str:
    if not run.profiles:
        return "## Weighted scores\n\nNo profile was given: no weighted score."
    names = [p.name for p in run.profiles]
    lines = [
        "## Weighted scores",
        "",
        "Each score is 0 to 1, shown next to the figures it weighs. A dimension without "
        "data (not reviewed, no price, not measured) is left out and the remaining weights "
        "are renormalized to sum to 1 (notes below the table).",
        "",
        "| candidate | pass rate | cross-file | TTFT p50 | cost per task | stability | "
        f"security | integration | {' | '.join(names)} |",
        f"|---|---|---|---|---|---|---|---|{'---|' * len(names)}",
    ]
    for candidate, f in run.figures.items():
        review = run.reviews.get(candidate)
        cells = [
            percent(f.correctness.value),
            percent(f.context.value),
            seconds(f.ttft_p50_s) if f.ttft_p50_s is not None else NOT_MEASURED,
            _unit_cost(f, run.currency),
            percent(f.stability),
            _review_score(review.data_security if review else None),
            _review_score(review.integration if review else None),
            *(score_text(run.scores[candidate][p].value) for p in names),
        ]
        lines.append(f"| {candidate} | {' | '.join(cells)} |")
    lines += ["", "Weights per profile (as written; before renormalization):", ""]
    for profile in run.profiles:
        weights = ", ".join(f"{d} {w:g}" for d, w in profile.weights.items() if w > 0)
        description = f": {profile.description}" if profile.description else ""
        lines.append(f"- **{profile.name}**{description} Weights: {weights}.")
    notes = _renormalized(run)
    if notes:
        lines += ["", "Renormalized weights:", "", *notes]
    return "\n".join(lines)


def _unit_cost(f: Figures, currency: str) -> str:
    if not f.priced:
        return NO_PRICE
    return money(f.cost_per_task, currency) if f.cost_per_task is not None else NOT_MEASURED


def _review_score(section: Any) -> str:
    return f"{section.score:g}/5" if section is not None else NOT_REVIEWED


def _renormalized(run: _Run) -> list[str]:
    notes = []
    for candidate, by_profile in run.scores.items():
        for profile, score in by_profile.items():
            if not score.dropped:
                continue
            dropped = "; ".join(f"{d}: {why}" for d, why in score.dropped.items())
            used = ", ".join(f"{d} {w:.3f}" for d, w in score.weights.items()) or "none"
            notes.append(
                f"- {candidate} under {profile}: left out {dropped}. Weights used: {used}."
            )
    return notes


def _not_measured(run: _Run) -> str:
    notes = []
    for candidate, f in run.figures.items():
        gaps = []
        if f.correctness.total == 0:
            gaps.append("correctness (no judged attempt)")
        if f.context.total == 0:
            gaps.append("context understanding (no cross-file attempt)")
        if f.answered == 0:
            gaps.append("speed (no attempt got an answer)")
        if not f.priced:
            gaps.append("unit cost (no price for this candidate)")
        elif f.cost_per_task is None:
            gaps.append("unit cost (no judged attempt)")
        if f.errors.total == 0:
            gaps.append("stability (no judged attempt)")
        review = run.reviews.get(candidate)
        if review is None or review.data_security is None:
            gaps.append("data security (not reviewed)")
        if review is None or review.integration is None:
            gaps.append("integration (not reviewed)")
        if gaps:
            notes.append(f"- {candidate}: {', '.join(gaps)}")
    if not notes:
        return ""
    lines = ["## Not measured", "", "These dimensions have no data; they count in no score.", ""]
    if run.reviews_note:
        lines += [f"No reviewer records: {run.reviews_note}.", ""]
    return "\n".join(lines + notes)


def _charts_section() -> str:
    return "\n".join([
        "## Charts",
        "",
        f"![pass rate against cost per completed task]({COST_CHART})",
        "",
        f"![time to first token per candidate]({TTFT_CHART})",
        "",
        f"![pass rate by task category]({CATEGORY_CHART})",
    ])  # fmt: skip


def _per_task(run: _Run) -> str:
    names = list(run.figures)
    tasks_meta = (run.manifest.get("suite") or {}).get("tasks") or {}
    tasks = sorted(set(tasks_meta) | {a.task for a in run.attempts})
    if not tasks or not names:
        return ""
    malformed = {(a.candidate, a.task) for a in run.attempts if scoring.is_malformed(a)}
    lines = [
        "## Per task",
        "",
        "Passes / attempts of each candidate at each task.",
        "",
        f"| task | category | {' | '.join(names)} |",
        f"|---|---|{'---|' * len(names)}",
    ]
    for task in tasks:
        category = (tasks_meta.get(task) or {}).get("category") or _category(run.attempts, task)
        cells = []
        for name in names:
            rate = run.figures[name].by_task.get(task)
            if rate is not None:
                cells.append(f"{rate.hits}/{rate.total}")
            elif (name, task) in malformed:
                cells.append("malformed task")
            else:
                cells.append(NO_VALUE)
        lines.append(f"| {task} | {category} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _category(attempts: list[Attempt], task: str) -> str:
    return next((a.category for a in attempts if a.task == task), "?")


def _failures(run: _Run) -> str:
    lines = ["## Failures", "", "Why attempts did not pass, counted per candidate."]
    for candidate, f in run.figures.items():
        lines += ["", f"**{candidate}**", ""]
        if not f.reasons:
            lines.append("- none")
        for reason, count in f.reasons.items():
            lines.append(f"- **{count}**: {_inline(reason)}")
    return "\n".join(lines)


def _reviewer_records(run: _Run) -> str:
    lines = ["## Reviewer records"]
    if run.reviews_note:
        lines += ["", f"No reviewer records: {run.reviews_note}."]
    for candidate in run.figures:
        review = run.reviews.get(candidate)
        lines += ["", f"### {candidate}", ""]
        if review is None:
            lines.append(f"{NOT_REVIEWED}: no record of this candidate.")
            continue
        lines.append(f"Reviewed by {review.reviewer} on {review.reviewed_on.isoformat()}"
                     f" (`{review.path}`).")  # fmt: skip
        security, integration = review.data_security, review.integration
        lines += ["", "Data security:", ""]
        if security is None:
            lines.append(f"- {NOT_REVIEWED}")
        else:
            lines += [
                f"- score: {security.score:g}/5",
                f"- retention: {_inline(security.retention)}",
                f"- encryption in transit: {_inline(security.encryption_in_transit)}",
                f"- certifications: {_inline(', '.join(security.certifications) or 'none')}",
                f"- evidence: {_links(security.evidence)}",
            ]
        lines += ["", "Integration:", ""]
        if integration is None:
            lines.append(f"- {NOT_REVIEWED}")
        else:
            lines += [
                f"- score: {integration.score:g}/5",
                f"- editor: {_inline(integration.editor)}",
                f"- version control: {_inline(integration.version_control)}",
                f"- CI: {_inline(integration.ci)}",
                f"- evidence: {_links(integration.evidence)}",
            ]
    return "\n".join(lines)


def _links(evidence: tuple[str, ...]) -> str:
    return ", ".join(
        f"<{e}>" if e.startswith(("http://", "https://")) else f"`{e}`" for e in evidence
    )


def _short(digest: Any) -> str:
    return str(digest)[:_DIGEST_SHOWN] if digest else "?"


def _mapping_text(value: Any) -> str:
    if not isinstance(value, dict):
        return "?" if value is None else str(value)
    return ", ".join(f"{k}={v}" for k, v in value.items())


def _inline(text: str) -> str:
    """Text from a record, on one line, safe inside Markdown (no tags, no table breaks)."""
    flat = " ".join(text.split())
    if len(flat) > _REASON_SHOWN:
        flat = flat[: _REASON_SHOWN - 1] + "…"
    return flat.replace("<", "&lt;").replace("|", "\\|")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- charts -------------------------------------------------------------------------------


def write_charts(
    directory: Path, attempts: list[Attempt], figures: dict[str, Figures], currency: str
) -> list[Path]:
    """The three PNG charts, written into `directory`; returns their paths."""
    # Imported here: matplotlib (the `charts` extra) is loaded only to draw.
    from gateway_control.scheduler.experiments.plots import pyplot

    plt = pyplot()

    paths = []
    for name, draw in (
        (COST_CHART, _cost_chart),
        (TTFT_CHART, _ttft_chart),
        (CATEGORY_CHART, _category_chart),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax, attempts, figures, currency)
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def _cost_chart(
    ax: Any, attempts: list[Attempt], figures: dict[str, Figures], currency: str
) -> None:
    ax.set_title("Pass rate against cost per completed task")
    ax.set_xlabel(f"cost per completed task ({currency}, manual corrections included)")
    ax.set_ylabel("pass rate (%)")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    unplotted = []
    for name, f in figures.items():
        if f.cost_per_task is None or f.correctness.value is None:
            unplotted.append(f"{name} ({NO_PRICE if not f.priced else NOT_MEASURED})")
            continue
        y = f.correctness.value * 100
        ax.scatter([f.cost_per_task], [y], s=60)
        ax.annotate(name, (f.cost_per_task, y), textcoords="offset points", xytext=(6, 6))
    plotted = [f.cost_per_task for f in figures.values() if f.cost_per_task is not None]
    # From zero: the distance between candidates reads as a share of what a task costs.
    ax.set_xlim(0, max(plotted) * 1.2 if plotted and max(plotted) > 0 else 1.0)
    if unplotted:
        ax.text(0.01, 0.01, "not shown: " + ", ".join(unplotted), transform=ax.transAxes,
                fontsize=8, va="bottom")  # fmt: skip


def _ttft_chart(
    ax: Any, attempts: list[Attempt], figures: dict[str, Figures], currency: str
) -> None:
    ax.set_title("Time to first token per candidate (answered attempts)")
    ax.set_ylabel("TTFT (s)")
    ax.grid(alpha=0.3, axis="y")
    data = {
        name: [a.ttft_s for a in attempts
               if a.candidate == name and a.ttft_s is not None and not scoring.is_malformed(a)]
        for name in figures
    }  # fmt: skip
    shown = {name: values for name, values in data.items() if values}
    if shown:
        ax.boxplot(list(shown.values()))
        ax.set_xticks(range(1, len(shown) + 1), [f"{n} (n={len(v)})" for n, v in shown.items()])
    missing = [name for name, values in data.items() if not values]
    if missing:
        ax.text(0.01, 0.99, f"{NOT_MEASURED} (no answer): " + ", ".join(missing),
                transform=ax.transAxes, fontsize=8, va="top")  # fmt: skip


def _category_chart(
    ax: Any, attempts: list[Attempt], figures: dict[str, Figures], currency: str
) -> None:
    ax.set_title("Pass rate by task category")
    ax.set_ylabel("pass rate (%)")
    ax.set_ylim(0, 125)  # room above 100 % for the legend
    ax.set_yticks(range(0, 101, 20))
    ax.grid(alpha=0.3, axis="y")
    categories = sorted({c for f in figures.values() for c in f.by_category})
    if not categories or not figures:
        ax.text(0.5, 0.5, NOT_MEASURED, transform=ax.transAxes, ha="center")
        return
    width = 0.8 / len(figures)
    for index, (name, f) in enumerate(figures.items()):
        xs = [i - 0.4 + width * (index + 0.5) for i in range(len(categories))]
        # A category the candidate has no attempt at gets no bar (NaN), not a bar at 0 %.
        heights = [_share(f.by_category.get(c)) for c in categories]
        ax.bar(xs, heights, width, label=name)
    ax.set_xticks(range(len(categories)), categories)
    ax.legend(loc="upper center", ncol=min(len(figures), 4))


def _share(rate: Rate | None) -> float:
    value = rate.value if rate is not None else None
    return float("nan") if value is None else value * 100
