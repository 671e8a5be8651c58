"""`gateway simulate autoscale`: static placement against the closed loop on one trace.

The trace is the shifting benchmark's (`SHIFTING`), or a YAML file (`--trace`):

```yaml
seed: 0
profiles:            # per model: how its requests behave
  llm-small: {service_s: 1.0, prefill_s: 0.1, ttft_target_s: 2.0, cost_tokens: 100, max_queued: 128}
phases:              # Poisson arrivals a second, per model; `ramp_to`: a straight line
  - {name: ramp, seconds: 300, rates: {llm-small: 2}, ramp_to: {llm-small: 20}}
bursts:              # `requests` at once (over `spread_s`), each of `n` choices, every `every_s`
  - {name: globex, model: llm-small, priority: batch, every_s: 80, requests: 24, n: 16}
```

Imports nothing heavy at the top: `gateway --help` builds every sub-command's options,
and the simulation's modules create the gateway's metrics (files, in multiprocess mode).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from gateway.config.schema import Float, Int, NonNegativeInt, PositiveFloat, PositiveInt, Strict

if TYPE_CHECKING:
    from gateway.config.source import Problem
    from gateway_control.placement.autoscale_sim import PolicyResult, Workload

# The benchmark's fleet, in the source tree.
DEFAULT_FLEET = (
    Path(__file__).resolve().parents[2] / "loadtest" / "autoscale-config" / "cluster.yaml"
)

COLUMNS = (
    "policy",
    "requests",
    "slo_attainment",
    "goodput_rps",
    "refused",
    "gpu_seconds",
    "replica_changes",
    "lost",
)


NonNegativeFloat = Annotated[Float, Field(ge=0)]
Priority = Literal["online", "batch"]


class TraceProfile(Strict):
    """How one model's requests behave in the simulation."""

    service_s: PositiveFloat
    prefill_s: NonNegativeFloat = 0.1
    ttft_target_s: PositiveFloat = 1.0
    cost_tokens: PositiveInt = 100
    max_queued: NonNegativeInt | None = None


class TracePhase(Strict):
    """Poisson arrivals a second per model, for `seconds`; with `ramp_to`, a ramp."""

    name: str
    seconds: PositiveFloat
    rates: dict[str, NonNegativeFloat]
    ramp_to: dict[str, NonNegativeFloat] | None = None
    priority: Priority = "online"


class TraceBurst(Strict):
    """`requests` requests at once, again every `every_s`."""

    name: str
    model: str
    every_s: PositiveFloat
    requests: PositiveInt
    n: PositiveInt = 1
    spread_s: NonNegativeFloat = 0.0
    start_s: NonNegativeFloat = 0.0
    priority: Priority = "online"
    service_s: PositiveFloat | None = None
    cost_tokens: PositiveInt | None = None


class TraceFile(Strict):
    """A trace of arrivals for `gateway simulate autoscale --trace`."""

    seed: Int = 0
    profiles: Annotated[dict[str, TraceProfile], Field(min_length=1)]
    phases: Annotated[list[TracePhase], Field(min_length=1)]
    bursts: list[TraceBurst] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_models(self) -> TraceFile:
        named = [m for p in self.phases for m in (*p.rates, *(p.ramp_to or {}))]
        unknown = sorted({*named, *(b.model for b in self.bursts)} - set(self.profiles))
        if unknown:
            raise ValueError(f"models without a profile: {', '.join(unknown)}")
        return self

    def workload(self) -> Workload:
        from gateway_control.placement.autoscale_sim import Burst, ModelProfile, Phase, Workload

        return Workload(
            phases=[Phase(p.name, p.seconds, p.rates, p.priority, p.ramp_to) for p in self.phases],
            profiles={name: ModelProfile(**p.model_dump()) for name, p in self.profiles.items()},
            seed=self.seed,
            bursts=[Burst(**b.model_dump()) for b in self.bursts],
        )


def load_trace(path: str) -> tuple[Workload | None, list[Problem]]:
    """The trace file at `path` as a workload, or the problems found, at their lines."""
    from gateway.config.source import read_source
    from gateway.config.validation import validate_source

    source = read_source(path)
    problems = list(source.problems)
    if not source.parsed or problems:
        return None, problems
    trace, problems = validate_source(TraceFile, source)
    return (None if trace is None else trace.workload()), problems


def add_autoscale_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `simulate autoscale`."""
    parser.add_argument(
        "--cluster",
        default=str(DEFAULT_FLEET),
        help="cluster.yaml with `autoscale:` deployments (default: the benchmark's fleet)",
    )
    parser.add_argument(
        "--trace",
        metavar="YAML",
        help="a trace of arrivals (default: the shifting benchmark's; the format: "
        "gateway_control/placement/autoscale_cli.py)",
    )
    parser.add_argument(
        "--seed", type=int, help="the arrivals' seed (default: the trace's, else 0)"
    )
    parser.add_argument(
        "--load-s", type=float, default=2.0, help="seconds a replica takes to load (default 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--plot", metavar="PNG", help="chart demand and replicas into PNG")


def run_autoscale_command(args: argparse.Namespace) -> int:
    """Replay the shifting workload under both policies; print the table."""
    from gateway_control.cluster_config import check_cluster
    from gateway_control.placement.autoscale_sim import SHIFTING, run_policy

    cluster, _, problems = check_cluster(args.cluster)
    workload: Workload | None = SHIFTING
    if args.trace:
        workload, trace_problems = load_trace(args.trace)
        problems += trace_problems
    if cluster is None or workload is None:
        for problem in problems:
            print(problem)
        return 2
    deployed = {d.model for d in cluster.deployments}
    unknown = sorted(set(workload.profiles) - deployed)
    if unknown:
        print(f"{args.trace}: models not deployed in {args.cluster}: {', '.join(unknown)}")
        return 2
    if args.seed is not None:
        workload = replace(workload, seed=args.seed)
    # The loop's decisions are warnings on a live leader; here the table says enough.
    logging.getLogger("gateway.placement").setLevel(logging.ERROR)
    results = [
        run_policy(cluster, workload, loop=False, load_s=args.load_s),
        run_policy(cluster, workload, loop=True, load_s=args.load_s),
    ]
    if args.json:
        rows = [r.row() | {"timeline": [asdict(s) for s in r.timeline]} for r in results]
        print(json.dumps(rows))
    else:
        print(format_table(results))
    if args.plot:
        write_chart(results, args.plot)
    return 0


def format_table(results: Sequence[PolicyResult]) -> str:
    """The figures as a Markdown table."""
    rows = [[str(r.row()[c]) for c in COLUMNS] for r in results]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_chart(results: Sequence[PolicyResult], path: str) -> Path:
    """Demand per model (requests a second) and ready replicas per model and policy,
    over time, into one PNG (matplotlib: the `charts` extra)."""
    from gateway_control.scheduler.experiments.plots import pyplot

    plt = pyplot()

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    first = results[0].timeline
    times = [sample.t for sample in first]
    models = sorted(first[0].demand) if first else []
    colour = {model: f"C{i}" for i, model in enumerate(models)}
    for model in models:
        series = [sample.demand[model] for sample in first]
        top.plot(times, series, color=colour[model], label=model)
    top.set_ylabel("requests / s")
    top.set_title("Demand")
    top.legend()
    for result in results:
        style = "--" if result.policy == "static" else "-"
        for model in models:
            series = [sample.replicas[model] for sample in result.timeline]
            label = f"{model}, {result.policy}"
            bottom.step(times, series, style, color=colour[model], where="post", label=label)
    bottom.set_ylabel("replicas ready")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
