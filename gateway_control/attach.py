"""The control plane attached to a server: placement, and the demand the closed loop reads.

The server finds `attach` by its entry point (`gateway.serving.attachment`) when
gateway.yaml names a cluster file, and starts and stops what it returns. It holds the
placement (which points the server's pools at the nodes that host each model) and, with
autoscaled deployments, this server's demand reporter (its admission counts on the
board the leader's closed loop reads).
"""

from __future__ import annotations

from gateway.serving.attachment import ServerView
from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.controller import ClusterPlacement
from gateway_control.placement.demand_reporter import DemandReporter


class PlacementAttachment:
    """Placement and demand reporting, running in a server's process."""

    def __init__(self, placement: ClusterPlacement, reporter: DemandReporter | None) -> None:
        self.placement = placement
        self.reporter = reporter

    @property
    def cluster(self) -> ClusterConfig:
        """The cluster file's nodes and deployments."""
        return self.placement.cluster

    @property
    def scales_to_zero(self) -> set[str]:
        """The models the closed loop may leave without a replica (min_replicas 0)."""
        return self.placement.scales_to_zero

    async def start(self) -> None:
        """Place (or follow the leader's placement), then report demand."""
        await self.placement.start()
        if self.reporter is not None:
            self.reporter.start()

    async def stop(self) -> None:
        """Stop reporting, then stop placing (a leader hands its lease back)."""
        if self.reporter is not None:
            await self.reporter.stop()
        await self.placement.stop()


def attach(server: ServerView) -> PlacementAttachment | None:
    """The placement for `server`'s cluster file (None without one), with a demand
    reporter when the closed loop scales some of its deployments."""
    gateway = server.config.gateway
    placement = ClusterPlacement.load(
        gateway,
        server.config.gateway_path,
        server.routes,
        on_change=server.capacity_changed,
        redis=server.redis,
    )
    if placement is None:
        return None
    autoscaler = placement.autoscaler
    if autoscaler is None or autoscaler.board is None:
        return PlacementAttachment(placement, None)
    scaled = [d.model for d in placement.cluster.deployments if d.autoscale]
    reporter = DemandReporter(
        autoscaler.board,
        server.admission,
        [model for model in scaled if model in server.routes],
        placement.cluster.autoscaling.interval_s,
        moves=placement.moves,
    )
    placement.gateway_id = reporter.gateway
    return PlacementAttachment(placement, reporter)
