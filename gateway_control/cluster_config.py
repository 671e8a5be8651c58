"""`cluster.yaml`: the GPU nodes (each a Triton server) and the model deployments on them.

Read like the gateway's own config: YAML with line numbers, `${VAR}` substitution,
unknown keys refused, every problem reported as `file:line: message`.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import Field, HttpUrl, model_validator

from gateway.config.schema import (
    Float,
    Int,
    Kubeconfig,
    KubernetesLabel,
    KubernetesSubdomain,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Strict,
)
from gateway.config.source import ConfigError, Problem, Source, read_source
from gateway.config.validation import validate_source
from gateway_control.scheduler.policies.registry import POLICY_NAMES


class ClusterNode(Strict):
    """One GPU server: its Triton HTTP endpoint and its resources."""

    name: str
    # Triton's HTTP endpoint: inference, health and the model repository API.
    url: HttpUrl
    gpus: PositiveInt
    gpu_model: str = "any"
    cpu_milli: PositiveInt = 64_000
    memory_mib: PositiveInt = 262_144
    # An interconnect domain (NVLink island, rack): the topology policy keeps jobs in one.
    domain: str = ""

    @property
    def base_url(self) -> str:
        """`url` without a trailing slash, to append API paths to."""
        return str(self.url).rstrip("/")


class ScaleTargets(Strict):
    """What a model's replicas must deliver; the loop adds replicas before they are
    missed (docs/autoscaling.md)."""

    # The 95th percentile of the time a request waits for a slot, in seconds, as the
    # queueing model predicts it from the measured demand.
    queue_wait_p95_s: PositiveFloat = 0.5
    # The 95th percentile of time to first token the gateways measure: above it, with
    # requests waiting, one more replica whatever the model predicts (it corrects the
    # model); None: no such check.
    ttft_p95_s: PositiveFloat | None = None
    # The busy share of a model's slots at most, so that a burst finds room.
    utilization: Annotated[Float, Field(gt=0, le=1)] = 0.75


class Autoscale(Strict):
    """A deployment whose replica count follows its demand, within bounds."""

    min_replicas: NonNegativeInt = 1  # 0: the model may scale to zero when idle
    max_replicas: PositiveInt
    # Requests one replica serves at once; default: the model's
    # `queue.max_in_flight_per_replica` in gateway.yaml, else 1.
    slots_per_replica: PositiveInt | None = None
    targets: ScaleTargets = Field(default_factory=ScaleTargets)
    # Demand must stay low this long before a replica is removed.
    scale_down_after_s: PositiveFloat = 120.0
    # A replica runs at least this long before it is removed or reclaimed.
    min_runtime_s: Annotated[Float, Field(ge=0)] = 60.0
    # A rise this soon after a scale-down is a flap: it doubles the quiet the next
    # scale-down waits for (up to the longer of scale_down_after_s and this); a
    # scale-down that no rise follows within it sets the wait back. 0: no such rule.
    flap_window_s: Annotated[Float, Field(ge=0)] = 600.0
    # online: only demand outside `autoscaling.batch_classes` adds replicas (batch
    # demand keeps them, never adds one); batch: a model for batch work, any demand does.
    serves: Literal["online", "batch"] = "online"

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas is above max_replicas")
        return self


class KubernetesScaling(Strict):
    """Models whose replicas are a Kubernetes Deployment's pods: the loop sets the
    Deployment's scale (its `scale` subresource) instead of loading them on nodes."""

    # model -> the name of its Triton Deployment.
    deployments: dict[str, KubernetesSubdomain]
    namespace: KubernetesLabel | None = None  # default: the pod's own
    kubeconfig: Kubeconfig | None = None  # default: in-cluster, else $KUBECONFIG


class TenantQuota(Strict):
    """What one tenant's deployments may hold of the fleet."""

    max_gpus: PositiveFloat  # GPUs in all (a replica of gpu_milli 500 counts half)


class Autoscaling(Strict):
    """The loop itself: how often it decides, and when a gateway's signals are too old."""

    interval_s: PositiveFloat = 10.0
    # A gateway's demand report older than this is missing: its models are held, never
    # scaled down on missing data.
    stale_after_s: PositiveFloat = 30.0
    # How long a replica being removed may take to finish its requests and streams.
    drain_timeout_s: PositiveFloat = 120.0
    # Per tenant (a deployment's `tenant`): the loop grows its models only within this.
    quotas: dict[str, TenantQuota] = Field(default_factory=dict)
    # Admission classes (gateway.yaml's `admission.classes`) whose demand keeps an
    # online model's replicas but never adds one.
    batch_classes: list[str] = Field(default_factory=lambda: ["batch"])
    kubernetes: KubernetesScaling | None = None


class Deployment(Strict):
    """A model and how many replicas of what size it runs."""

    model: str
    replicas: PositiveInt = 1
    # Whole GPUs per replica, or `gpu_milli` thousandths of one GPU (shared) when below 1000.
    gpus: NonNegativeInt = 1
    gpu_milli: Annotated[Int, Field(ge=1, le=1000)] = 1000
    cpu_milli: NonNegativeInt = 4_000
    memory_mib: NonNegativeInt = 16_384
    # Allowed GPU models; empty: any.
    gpu_models: list[str] = Field(default_factory=list)
    tenant: str = ""
    # Higher numbers are placed first and keep their place when capacity runs short.
    priority: Int = 0
    # Replicas that follow demand; `replicas` is then the count it starts with.
    autoscale: Autoscale | None = None

    @model_validator(mode="after")
    def _one_gpu_when_shared(self) -> Deployment:
        if self.gpu_milli < 1000 and self.gpus != 1:
            raise ValueError("a replica with gpu_milli below 1000 shares one GPU: set gpus: 1")
        scale = self.autoscale
        if scale is not None and not scale.min_replicas <= self.replicas <= scale.max_replicas:
            raise ValueError(
                f"replicas ({self.replicas}) must be within autoscale's min_replicas and "
                f"max_replicas ({scale.min_replicas}..{scale.max_replicas})"
            )
        return self


class ClusterConfig(Strict):
    """The whole file."""

    # A placement policy by name (`gateway simulate packing --help` lists them).
    policy: str = "best"
    nodes: list[ClusterNode]
    deployments: list[Deployment] = Field(default_factory=list)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)


def load_cluster(path: str) -> ClusterConfig:
    """The cluster file at `path`, validated; raises ConfigError listing every problem."""
    cluster, _, problems = check_cluster(path)
    if problems or cluster is None:
        raise ConfigError(problems)
    return cluster


def check_cluster(path: str) -> tuple[ClusterConfig | None, Source, list[Problem]]:
    """Read and validate the cluster file: (the config or None, its source, problems).

    The source lets a caller report its own cross checks at the file's lines.
    """
    source = read_source(path)
    problems = list(source.problems)
    cluster = None
    if source.parsed and not problems:
        cluster, problems = validate_source(ClusterConfig, source)
    if cluster is not None:
        problems += _duplicates(source, cluster)
        if cluster.policy != "best" and cluster.policy not in POLICY_NAMES:
            choices = ", ".join(("best", *POLICY_NAMES))
            message = f"policy: unknown {cluster.policy!r}, choose from {choices}"
            problems.append(source.problem(("policy",), message))
    return (None if problems else cluster), source, problems


def _duplicates(source: Source, cluster: ClusterConfig) -> list[Problem]:
    problems = []
    for section, names in (
        ("nodes", [n.name for n in cluster.nodes]),
        ("deployments", [d.model for d in cluster.deployments]),
    ):
        seen = Counter(names)
        for index, name in enumerate(names):
            if seen[name] > 1:
                message = f"{section}[{index}]: duplicate name {name!r}"
                problems.append(source.problem((section, index), message))
    return problems
