"""The closed loop on the placement leader: demand in, desired replicas out.

Each interval the leader reads every gateway's demand (`demand_board`), sums it
(`DemandTracker`), and asks the `ReplicaPlanner` for each autoscaled model's replicas.
The counts it settles on replace the deployments' `replicas` in the cluster the leader
places (`cluster_for`), so every change goes through placement's own rules: priorities,
best fit, availability before redundancy, and the fleet's size (what does not fit is
unplaced, and the lower priorities are the ones left out).

A scale-down removes the model's newest replica (placement keeps the lowest indices);
if that replica has run less than `min_runtime_s`, the change waits (reason
`min_runtime`), so a replica is never removed young; nor is it reclaimed by placement for
a higher priority (`protected`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace

from gateway.observability import metrics, tracing
from gateway.storage.redis_client import REDIS_ERRORS
from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.demand_board import DemandBoard, DemandTracker, GatewayReport
from gateway_control.placement.deployment import DeploymentPlan, replica_pod
from gateway_control.placement.kubernetes_scale import SCALE_ERRORS, DeploymentScaler
from gateway_control.placement.queueing_model import Demand
from gateway_control.placement.replica_planner import ReplicaPlanner, ScaleDecision
from gateway_control.scheduler.cluster import GPU_MILLI

log = logging.getLogger("gateway.placement")


class Autoscaler:
    """Desired replicas per autoscaled model, decided from the gateways' demand."""

    def __init__(
        self,
        cluster: ClusterConfig,
        board: DemandBoard | None,
        slots: Mapping[str, int],
        scaler: DeploymentScaler | None = None,
    ) -> None:
        # Where the gateways' demand is read (None: the caller passes it to `decide`).
        self.board = board
        # The models whose replicas are a Kubernetes Deployment's pods (None: none).
        self.scaler = scaler
        self._tracker = DemandTracker(cluster.autoscaling.batch_classes)
        self._interval_s = cluster.autoscaling.interval_s
        self._planner = ReplicaPlanner(cluster.deployments, slots, self._interval_s)
        self._min_runtime = {
            d.model: d.autoscale.min_runtime_s
            for d in cluster.deployments
            if d.autoscale is not None
        }
        self.desired = {d.model: d.replicas for d in cluster.deployments if d.autoscale}
        # The fleet's GPU less what the deployments without `autoscale` hold: the room
        # the scaled models share (None: Kubernetes runs them, the fleet is its).
        fixed = sum(
            replica_pod(d, 0).requested_milli * d.replicas
            for d in cluster.deployments
            if d.autoscale is None
        )
        # Quotas per tenant, in thousandths of a GPU, and what the loop needs to apply them.
        self._quotas = {
            tenant: round(quota.max_gpus * GPU_MILLI)
            for tenant, quota in cluster.autoscaling.quotas.items()
        }
        self._tenant = {d.model: d.tenant for d in cluster.deployments}
        self._priority = {d.model: d.priority for d in cluster.deployments}
        self._size = {d.model: replica_pod(d, 0).requested_milli for d in cluster.deployments}
        self._fixed_by_tenant: dict[str, int] = {}
        for d in cluster.deployments:
            if d.autoscale is None:
                fixed_milli = self._size[d.model] * d.replicas
                self._fixed_by_tenant[d.tenant] = (
                    self._fixed_by_tenant.get(d.tenant, 0) + fixed_milli
                )
        self._room_milli: int | None = (
            sum(n.gpus for n in cluster.nodes) * GPU_MILLI - fixed if scaler is None else None
        )
        # When a model was last asked to grow and has not yet got all it asked for.
        self._growing_since: dict[str, float] = {}
        # When each replica (model, index) was first seen placed, by the caller's clock.
        self._placed_at: dict[tuple[str, int], float] = {}

    @property
    def interval_s(self) -> float:
        """How often `step` is to be called."""
        return self._interval_s

    def cluster_for(self, cluster: ClusterConfig) -> ClusterConfig:
        """`cluster` with each autoscaled deployment's replicas at the desired count (the
        ones Kubernetes runs are not placed on the nodes)."""
        deployments = [
            d.model_copy(update={"replicas": self.desired[d.model]})
            if d.model in self.desired
            else d
            for d in cluster.deployments
            if self.scaler is None or not self.scaler.manages(d.model)
        ]
        return cluster.model_copy(update={"deployments": deployments})

    def observe(self, plan: DeploymentPlan, now: float) -> None:
        """Note which replicas are placed (and since when), and the ready counts: the
        leader's plan holds only replicas it has loaded."""
        placed = {(p.model, p.index) for p in plan.placements}
        for replica in placed - set(self._placed_at):
            self._placed_at[replica] = now
        for replica in set(self._placed_at) - placed:
            if not self._on_kubernetes(replica[0]):  # those are aged from the decision
                del self._placed_at[replica]
        for model, desired in self.desired.items():
            metrics.labels(metrics.MODEL_REPLICAS, model, "desired").set(desired)
            if self.scaler is None or not self.scaler.manages(model):
                count = sum(1 for m, _ in placed if m == model)
                metrics.labels(metrics.MODEL_REPLICAS, model, "ready").set(count)
                self._note_ready(model, count, now)

    async def act(self, changes: list[ScaleDecision]) -> bool:
        """Set the scale of the changed models that Kubernetes runs (and read what it
        runs of each); whether any other changed, for placement on the nodes to do."""
        if self.scaler is None:
            return bool(changes)
        scaler = self.scaler
        for change in changes:
            if scaler.manages(change.model):
                try:
                    await scaler.set_replicas(change.model, change.desired)
                except SCALE_ERRORS as exc:
                    log.warning(
                        "autoscale %s: scale not set (%s); next interval", change.model, exc
                    )
                    self.desired[change.model] = change.current  # decided again next time
        for model in self.desired:
            if scaler.manages(model):
                try:
                    running = await scaler.replicas(model)
                except SCALE_ERRORS:
                    continue
                metrics.labels(metrics.MODEL_REPLICAS, model, "ready").set(running)
                self._note_ready(model, running, asyncio.get_running_loop().time())
        return any(not scaler.manages(c.model) for c in changes)

    async def step(self, plan: DeploymentPlan, now: float) -> list[ScaleDecision]:
        """One interval: every gateway's demand read and `decide`d on. Redis
        unreachable: no demand, so every model holds."""
        try:
            reports = [] if self.board is None else await self.board.read()
        except REDIS_ERRORS as exc:
            log.warning("demand unreadable (Redis: %s): replicas held", exc)
            reports = []
        return self.decide(plan, now, self.demand(reports))

    def demand(self, reports: list[GatewayReport]) -> dict[str, Demand]:
        """Every gateway's reports summed into each model's demand since the last read
        (`gateway simulate autoscale` passes what its gateways would report)."""
        return self._tracker.update(reports)

    def decide(
        self, plan: DeploymentPlan, now: float, demand: Mapping[str, Demand | None]
    ) -> list[ScaleDecision]:
        """The decisions that change a desired count (applied to `desired`), from each
        model's demand (None: missing or stale). Pure but for the metrics and the log:
        `gateway simulate autoscale` runs it on a trace."""
        placed = {model: len(plan.nodes_of(model)) for model in self.desired}
        # The interval as a trace of its own (tracing on), a span per model's decision.
        trace, started = tracing.begin_task("gateway.autoscale"), time.monotonic()
        # The planner counts from what is desired, not placed: a replica that fits
        # nowhere is still wanted, and asked for again when room appears.
        changes = []
        decisions = self._within_quotas(
            self._planner.decide(now, self.desired, demand, plan.unplaced, self._room_milli)
        )
        for decision in decisions:
            if decision.direction == "down" and self._too_young(decision.model, now):
                decision = _held(decision, "min_runtime")
            if decision.direction == "none" and decision.reason in ("min_runtime", "quota"):
                self._planner.held(decision.model)
            elif (
                decision.direction == "down"
                and not self._on_kubernetes(decision.model)
                and decision.desired >= placed[decision.model]
            ):
                self._planner.held(decision.model, changed=True)  # only unplaced ones go
            _log(decision, placed.get(decision.model, 0))
            tracing.step(
                trace, f"gateway.autoscale {decision.model}", started, _traced(decision, placed)
            )
            if decision.direction == "up":
                self._growing_since.setdefault(decision.model, now)
                if self._on_kubernetes(decision.model):
                    # Its pods' ages are not read: a pod is as old as the ask for it.
                    for index in range(decision.current, decision.desired):
                        self._placed_at[(decision.model, index)] = now
            elif decision.direction == "down":
                self._growing_since.pop(decision.model, None)
            if decision.direction != "none":
                self.desired[decision.model] = decision.desired
                metrics.labels(
                    metrics.SCALE_EVENTS, decision.model, decision.direction, decision.reason
                ).inc()
                changes.append(decision)
        if trace is not None:
            trace.end("gateway.autoscale", {"gateway.autoscale.changes": len(changes)})
        return changes

    def _note_ready(self, model: str, ready: int, now: float) -> None:
        """Time the scale-up of `model` once its replicas are all ready."""
        since = self._growing_since.get(model)
        if since is not None and ready >= self.desired[model]:
            metrics.labels(metrics.SCALE_UP_SECONDS, model).observe(now - since)
            del self._growing_since[model]

    def _on_kubernetes(self, model: str) -> bool:
        return self.scaler is not None and self.scaler.manages(model)

    def _within_quotas(self, decisions: list[ScaleDecision]) -> list[ScaleDecision]:
        """`decisions` with the rises of each tenant's models cut to its quota (reason
        `quota`), the higher priorities served first; nothing above a quota is asked."""
        if not self._quotas:
            return decisions
        held: dict[str, int] = dict(self._fixed_by_tenant)
        for decision in decisions:
            tenant = self._tenant[decision.model]
            held[tenant] = held.get(tenant, 0) + decision.current * self._size[decision.model]
        decided = {}
        rising = sorted(
            (d for d in decisions if d.direction == "up"),
            key=lambda d: -self._priority[d.model],
        )
        for decision in rising:
            tenant = self._tenant[decision.model]
            quota = self._quotas.get(tenant)
            if quota is None:
                continue
            size = self._size[decision.model]
            room = max(0, quota - held.get(tenant, 0))
            granted = min(decision.desired - decision.current, room // size)
            held[tenant] = held.get(tenant, 0) + granted * size
            if granted < decision.desired - decision.current:
                decided[decision.model] = replace(
                    decision, desired=decision.current + granted, reason="quota"
                )
        return [decided.get(d.model, d) for d in decisions]

    def adopt(self, plan: DeploymentPlan) -> None:
        """Take a published placement's counts as desired (a new leader goes on where
        the last one stopped, not from cluster.yaml's `replicas`)."""
        for model in self.desired:
            if self.scaler is None or not self.scaler.manages(model):
                self.desired[model] = len(plan.nodes_of(model)) + plan.unplaced.get(model, 0)

    def behind(self, plan: DeploymentPlan) -> bool:
        """Whether `plan` (what is loaded) holds a count other than desired of some model
        placed on the nodes, and not for want of room: a load that failed, tried again
        each interval."""
        return any(
            len(plan.nodes_of(model)) + plan.unplaced.get(model, 0) != desired
            for model, desired in self.desired.items()
            if self.scaler is None or not self.scaler.manages(model)
        )

    def protected(self, now: float) -> set[tuple[str, int]]:
        """The replicas (model, index) younger than their model's `min_runtime_s`: placement
        may not reclaim them for another model."""
        return {
            (model, index)
            for (model, index), since in self._placed_at.items()
            if now - since < self._min_runtime.get(model, 0.0)
        }

    def _too_young(self, model: str, now: float) -> bool:
        """Whether the replica a scale-down would remove (the newest) is too young."""
        newest = self.desired[model] - 1
        since = self._placed_at.get((model, newest))
        return since is not None and now - since < self._min_runtime[model]


def _held(decision: ScaleDecision, reason: str) -> ScaleDecision:
    return replace(decision, desired=decision.current, reason=reason)


def _traced(decision: ScaleDecision, placed: Mapping[str, int]) -> dict[str, tracing.Attribute]:
    """A decision's span: its outcome and what it was made from (as the log line's)."""
    attributes: dict[str, tracing.Attribute] = {
        "gateway.model": decision.model,
        "gateway.autoscale.direction": decision.direction,
        "gateway.autoscale.reason": decision.reason,
        "gateway.autoscale.current": decision.current,
        "gateway.autoscale.desired": decision.desired,
        "gateway.autoscale.needed": decision.needed,
        "gateway.autoscale.placed": placed.get(decision.model, 0),
        "gateway.autoscale.queued": decision.queued,
        "gateway.autoscale.batch_rate": decision.batch_rate,
    }
    optional = {
        "gateway.autoscale.kept": decision.kept,
        "gateway.autoscale.arrival_rate": decision.arrival_rate,
        "gateway.autoscale.service_s": decision.service_s,
        "gateway.autoscale.ttft_p95_s": decision.ttft_p95_s,
        "gateway.autoscale.down_wait_s": decision.down_wait_s,
    }
    attributes.update({key: value for key, value in optional.items() if value is not None})
    return attributes


def _log(decision: ScaleDecision, placed: int) -> None:
    """Each decision with its inputs: a change at warning, the rest at debug."""
    level = logging.WARNING if decision.direction != "none" else logging.DEBUG
    log.log(
        level,
        "autoscale %s: %d -> %d (%s; placed %d, needed %d, kept %d, %.2f req/s of %.3f s "
        "(%.2f of it batch), %.1f queued, ttft p95 %s, a scale-down waits %.0f s)",
        decision.model, decision.current, decision.desired, decision.reason, placed,
        decision.needed, decision.needed if decision.kept is None else decision.kept,
        decision.arrival_rate or 0.0, decision.service_s or 0.0, decision.batch_rate,
        decision.queued, decision.ttft_p95_s, decision.down_wait_s or 0.0,
        extra={"fields": {
            "event": "autoscale", "model": decision.model, "current": decision.current,
            "desired": decision.desired, "reason": decision.reason, "placed": placed,
            "needed": decision.needed, "kept": decision.kept,
            "batch_rate": decision.batch_rate, "arrival_rate": decision.arrival_rate,
            "service_s": decision.service_s, "queued": decision.queued,
            "ttft_p95_s": decision.ttft_p95_s, "down_wait_s": decision.down_wait_s,
        }},
    )  # fmt: skip
