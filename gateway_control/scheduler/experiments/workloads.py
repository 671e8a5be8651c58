"""Workload families derived from one pod list, the way the FGD paper's artifact varied it.

The paper (Weng et al., ATC'23, Sec. 6.3-6.5) evaluates, besides the default openb pod
list, lists that emphasise one kind of pod; the published files were sampled from the
default one. Only the default list is at hand here, so this module re-derives such
families from it, seeded:

- `gpushareNN`: GPU-sharing pods carry NN % of the GPU requests (the paper's x axis is
  "proportion of GPU-sharing workloads in terms of GPU requests"; default: about 28 %);
- `multigpuNN`: pods with two or more GPUs carry NN % of the GPU requests (default: 7 %);
- `gpuspecNN`: NN % of the GPU pods are restricted to GPU models (default: none; the
  paper's production cluster has about 33 %).

For `gpushare` and `multigpu` the GPU pods are resampled with replacement from the two
groups (the emphasised kind and the other GPU pods) until each reaches its share of the
default list's total GPU request; CPU-only pods are kept as they are. For `gpuspec` the
pods are the default ones and NN % of the GPU pods, chosen at random, get an allowed-model
list: one model (three times in four) or two to three models, drawn in proportion to the
GPUs of each model among the nodes that could host the pod when empty, so that no pod is
made impossible. Names are rewritten `<family>-<index>` so that duplicates stay distinct.
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gateway_control.scheduler.cluster import Node, Pod

FAMILY_KINDS = ("gpushare", "multigpu", "gpuspec")
# The levels the paper plots (its default list sits near gpushare 28 and multigpu 7).
PAPER_LEVELS = {
    "gpushare": (40, 60, 80, 100),
    "multigpu": (20, 30, 40, 50),
    "gpuspec": (10, 20, 33),
}
SINGLE_MODEL_ODDS = 0.75  # the share of constrained pods that allow exactly one model
_FAMILY = re.compile(r"^(gpushare|multigpu|gpuspec)(\d{1,3})$")


def family_names() -> list[str]:
    """Every family the paper plots, e.g. `gpushare40` ... `gpuspec33`."""
    return [f"{kind}{level}" for kind in FAMILY_KINDS for level in PAPER_LEVELS[kind]]


def parse_family(name: str) -> tuple[str, int]:
    """`gpushare60` -> ("gpushare", 60); raises ValueError on anything else."""
    match = _FAMILY.match(name)
    if match is None or not 0 <= int(match.group(2)) <= 100:
        raise ValueError(
            f"unknown workload family {name!r}: want gpushareNN, multigpuNN or gpuspecNN"
        )
    return match.group(1), int(match.group(2))


def derive(name: str, pods: Sequence[Pod], nodes: Sequence[Node], seed: int) -> list[Pod]:
    """The pod list of family `name` (see the module doc), derived from `pods`, seeded."""
    kind, percent = parse_family(name)
    rng = random.Random(f"{name}/{seed}")  # a string seed: stable across runs and platforms
    if kind == "gpushare":
        derived = _emphasise(pods, lambda p: p.shared, percent / 100, rng)
    elif kind == "multigpu":
        derived = _emphasise(pods, lambda p: p.num_gpu >= 2, percent / 100, rng)
    else:
        derived = _constrain(pods, nodes, percent / 100, rng)
    return [replace(p, name=f"{name}-{i:05d}") for i, p in enumerate(derived)]


def _emphasise(
    pods: Sequence[Pod], chosen: Callable[[Pod], bool], fraction: float, rng: random.Random
) -> list[Pod]:
    """CPU-only pods unchanged; GPU pods resampled so that those `chosen` carry `fraction`
    of the (unchanged) total GPU request."""
    gpu_pods = [p for p in pods if p.num_gpu > 0]
    total = sum(p.requested_milli for p in gpu_pods)
    emphasised = [p for p in gpu_pods if chosen(p)]
    others = [p for p in gpu_pods if not chosen(p)]
    out = [p for p in pods if p.num_gpu == 0]
    for group, target in ((emphasised, fraction * total), (others, (1 - fraction) * total)):
        if target > 0 and not group:
            raise ValueError("the pod list has no pod of a kind this family needs")
        requested = 0
        while requested < target:
            pod = rng.choice(group)
            out.append(pod)
            requested += pod.requested_milli
    return out


def _constrain(
    pods: Sequence[Pod], nodes: Sequence[Node], fraction: float, rng: random.Random
) -> list[Pod]:
    """`pods` with `fraction` of the GPU pods restricted to models that could host them."""
    gpus_of_model: dict[str, int] = {}
    for node in nodes:
        if node.gpus:
            gpus_of_model[node.gpu_model] = gpus_of_model.get(node.gpu_model, 0) + node.gpus
    gpu_indices = [i for i, p in enumerate(pods) if p.num_gpu > 0]
    picked = set(rng.sample(gpu_indices, round(fraction * len(gpu_indices))))
    out = list(pods)
    for index in sorted(picked):
        pod = out[index]
        hosts = sorted({n.gpu_model for n in nodes if _fits_empty(pod, n)})
        if not hosts:
            continue  # fits nowhere anyway: a constraint would change nothing
        weights = [gpus_of_model[m] for m in hosts]
        wanted = 1 if rng.random() < SINGLE_MODEL_ODDS else rng.randint(2, 3)
        models: set[str] = set()
        while len(models) < min(wanted, len(hosts)):
            models.add(rng.choices(hosts, weights)[0])
        out[index] = replace(pod, gpu_models=frozenset(models))
    return out


def _fits_empty(pod: Pod, node: Node) -> bool:
    return (
        pod.num_gpu <= node.gpus
        and pod.cpu_milli <= node.cpu_milli
        and pod.memory_mib <= node.memory_mib
    )


POD_COLUMNS = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
]


def write_pods(path: str | Path, pods: Sequence[Pod]) -> None:
    """Write `pods` as an openb pod list (the columns `load_pods` reads; the others are
    filled with neutral values: qos LS, phase Running, times 0)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(POD_COLUMNS)
        for p in pods:
            writer.writerow(
                [
                    p.name,
                    p.cpu_milli,
                    p.memory_mib,
                    p.num_gpu,
                    p.gpu_milli if p.num_gpu else 0,
                    "|".join(sorted(p.gpu_models)),
                    "LS",
                    "Running",
                    0,
                    0,
                    0,
                ]
            )
