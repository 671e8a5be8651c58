"""Where each model replica runs: the deployments of `cluster.yaml` placed on its nodes.

Pure: no I/O. Replicas are placed one at a time by a placement policy (the same ones
the packing experiment measures), availability before redundancy: every model gets a
replica before any gets a second (and a second before any a third); within a round,
higher priority first, then larger ones first (big replicas are the hard ones to fit),
then by model name, so a plan is reproducible. When GPUs run short, the models of lower
priority are the ones left without a replica.
Replicas of one model go to different nodes while some node that fits has none of them,
so one node failing takes down as few replicas of a model as it can. When nodes go
down, `plan_deployments(..., keep=previous)` keeps every replica on a healthy node where
it is and places only the lost ones, where capacity allows.

Reclaiming: a replica of a higher priority that fits nowhere takes the place of a kept
replica of a lower priority, if that deployment keeps its `autoscale.min_replicas` (a
deployment without `autoscale` keeps all its replicas) and the replica is not
`protected` (younger than its minimum runtime: the caller knows ages, placement does
not). The reclaimed replica is unplaced: wanted still, and placed again when room
returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from gateway_control.cluster_config import ClusterConfig, Deployment
from gateway_control.scheduler.cluster import GPU_MILLI, Cluster, Node, Placement, Pod
from gateway_control.scheduler.fragmentation import target_workload
from gateway_control.scheduler.policies.policy import Policy
from gateway_control.scheduler.policies.registry import BEST_POLICY, make_policy


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Replica `index` of `model` runs on `node`, on these GPU indices."""

    model: str
    index: int
    node: str
    gpus: tuple[int, ...]


@dataclass(slots=True)
class DeploymentPlan:
    """Every replica's place, and how many of each model's replicas fit nowhere."""

    placements: list[ReplicaPlacement] = field(default_factory=list)
    unplaced: dict[str, int] = field(default_factory=dict)

    def nodes_of(self, model: str) -> list[str]:
        """The nodes running replicas of `model` (a node twice if it runs two)."""
        return [p.node for p in self.placements if p.model == model]

    def models_on(self, node: str) -> set[str]:
        """The models with at least one replica on `node`."""
        return {p.model for p in self.placements if p.node == node}


def replica_pod(deployment: Deployment, index: int) -> Pod:
    """One replica of `deployment` as the placement policies see it."""
    shared = deployment.gpu_milli < GPU_MILLI
    return Pod(
        name=f"{deployment.model}#{index}",
        num_gpu=1 if shared else deployment.gpus,
        gpu_milli=deployment.gpu_milli if shared else GPU_MILLI,
        cpu_milli=deployment.cpu_milli,
        memory_mib=deployment.memory_mib,
        gpu_models=frozenset(deployment.gpu_models),
    )


def plan_deployments(
    cluster: ClusterConfig,
    down: Collection[str] = (),
    keep: DeploymentPlan | None = None,
    protected: Collection[tuple[str, int]] = (),
) -> DeploymentPlan:
    """Place every replica of every deployment on the nodes not in `down`.

    With `keep`, its replicas on nodes still up stay where they are; the rest of the
    replicas (those that were on a node now down, or never placed) are placed anew,
    reclaiming lower priorities' replicas (not the `protected` ones) when they fit
    nowhere else.
    """
    nodes = [
        Node(n.name, n.gpus, n.gpu_model, n.cpu_milli, n.memory_mib, domain=n.domain)
        for n in cluster.nodes
    ]
    for node in nodes:
        node.healthy = node.name not in down
    index_of = {node.name: i for i, node in enumerate(nodes)}
    state = Cluster(nodes)
    deployments = sorted(
        cluster.deployments,
        key=lambda d: (-d.priority, -replica_pod(d, 0).requested_milli, d.model),
    )
    plan = DeploymentPlan()
    kept: set[tuple[str, int]] = set()
    by_model = {d.model: d for d in cluster.deployments}
    for placed in keep.placements if keep is not None else ():
        deployment = by_model.get(placed.model)
        if deployment is None or placed.node in down or placed.node not in index_of:
            continue
        if placed.index >= deployment.replicas:
            continue
        state.place(
            replica_pod(deployment, placed.index), Placement(index_of[placed.node], placed.gpus)
        )
        plan.placements.append(placed)
        kept.add((placed.model, placed.index))

    pods = [replica_pod(d, i) for d in deployments for i in range(d.replicas)]
    name = BEST_POLICY if cluster.policy == "best" else cluster.policy
    policy = make_policy(name, seed=0, shapes=target_workload(pods))
    policy.bind(state)
    rank = {d.model: i for i, d in enumerate(deployments)}
    pending = {
        d.model: [i for i in range(d.replicas) if (d.model, i) not in kept] for d in deployments
    }
    serving = Counter(model for model, _ in kept)
    while any(pending.values()):
        # Availability before redundancy: the next replica is one of the model with the
        # fewest replicas so far, so every model gets one before any gets a second; among
        # those, the deployments' order (priority, size, name).
        deployment = min(
            (d for d in deployments if pending[d.model]),
            key=lambda d: (serving[d.model], rank[d.model]),
        )
        index = pending[deployment.model].pop(0)
        pod = replica_pod(deployment, index)
        placement = _spread(policy, pod, nodes, plan.nodes_of(deployment.model))
        if placement is None:
            placement = _reclaim(state, policy, pod, deployment, plan, by_model, serving, protected)
        if placement is None:
            # Its other replicas are the same size: they fit nowhere either.
            missing = 1 + len(pending[deployment.model])
            pending[deployment.model] = []
            plan.unplaced[deployment.model] = plan.unplaced.get(deployment.model, 0) + missing
            continue
        state.place(pod, placement)
        policy.placed(pod, placement)
        serving[deployment.model] += 1
        host = nodes[placement.node].name
        plan.placements.append(ReplicaPlacement(deployment.model, index, host, placement.gpus))
    plan.placements.sort(key=lambda p: (p.model, p.index))
    return plan


def _reclaim(
    state: Cluster,
    policy: Policy,
    pod: Pod,
    taker: Deployment,
    plan: DeploymentPlan,
    by_model: dict[str, Deployment],
    serving: Counter[str],
    protected: Collection[tuple[str, int]],
) -> Placement | None:
    """Make room for `pod` (of `taker`) by taking the place of one lower-priority
    replica that may go (the lowest priority first, its newest replica first); where
    `pod` goes then, or None when no such replica frees enough."""
    index_of = {node.name: i for i, node in enumerate(state.nodes)}
    victims = sorted(
        (
            p
            for p in plan.placements
            if by_model[p.model].priority < taker.priority
            and serving[p.model] > _minimum(by_model[p.model])
            and (p.model, p.index) not in protected
        ),
        key=lambda p: (by_model[p.model].priority, -p.index),
    )
    for victim in victims:
        victim_pod = replica_pod(by_model[victim.model], victim.index)
        where = Placement(index_of[victim.node], victim.gpus)
        state.unplace(victim_pod, where)
        policy.released(victim_pod, where)
        placement = policy.choose(pod)
        if placement is None:
            state.place(victim_pod, where)
            policy.placed(victim_pod, where)
            continue
        plan.placements.remove(victim)
        serving[victim.model] -= 1
        plan.unplaced[victim.model] = plan.unplaced.get(victim.model, 0) + 1
        return placement
    return None


def _minimum(deployment: Deployment) -> int:
    """The replicas a deployment keeps whatever others want."""
    scale = deployment.autoscale
    return deployment.replicas if scale is None else scale.min_replicas


def _spread(policy: Policy, pod: Pod, nodes: list[Node], hosts: list[str]) -> Placement | None:
    """The policy's choice among nodes without a replica of the model, else among all."""
    if hosts:
        hidden = [n for n in nodes if n.name in hosts and n.healthy]
        for node in hidden:
            node.healthy = False  # out of the policy's sight for this choice only
        try:
            placement = policy.choose(pod)
        finally:
            for node in hidden:
                node.healthy = True
        if placement is not None:
            return placement
    return policy.choose(pod)
