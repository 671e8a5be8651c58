"""Serving models where the scheduler places them, and placing them again when a node fails.

With `cluster_file` in gateway.yaml, the gateway plans the cluster's deployments at
start (`gateway_control.placement.deployment`), makes each node's Triton load what is placed on
it and unload the rest (`gateway_control.placement.triton_repository`), and serves each placed
model from the nodes that host it. It then probes every node's liveness: a node that
fails `node_down_after` probes in a row is down; its replicas leave their models' pools
at once (isolated), and are placed again on the nodes still up where capacity allows,
every other replica staying where it is. Replicas that fit nowhere are tried again at
each probe round, so they come back when a node does.

With several gateways (`placement.leader_election: redis`), only the holder of the
placement lease (gateway_control.placement.leadership) probes, plans and loads; it publishes each
placement in Redis, and the other gateways serve from the published one. When the leader
dies, another takes the lease once it expires and places from the published placement
on, so replicas do not move for a change of leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp

from gateway.backends.http import LazySession, get_ok
from gateway.backends.triton_metrics import default_metrics_url
from gateway.config import BackendKind, GatewayConfig
from gateway.observability import metrics, tracing
from gateway.storage.redis_client import REDIS_ERRORS, RedisClient
from gateway.storage.scripts import read_script
from gateway.upstream.route import ModelRoute
from gateway_control.cluster_config import ClusterConfig, ClusterNode, load_cluster
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.demand_board import DemandBoard
from gateway_control.placement.deployment import DeploymentPlan, ReplicaPlacement, plan_deployments
from gateway_control.placement.kubernetes_scale import DeploymentScaler
from gateway_control.placement.leadership import (
    LeaseUnavailable,
    LostLeadership,
    PlacementLease,
    RedisLease,
)
from gateway_control.placement.triton_repository import (
    Action,
    RepositoryError,
    apply_plan,
    unloads_for,
)
from gateway_control.placement.warm_up import warm_up

log = logging.getLogger("gateway.placement")

PROBE_TIMEOUT_S = 1.0
# How often a drain looks at the requests still on a replica that leaves.
DRAIN_POLL_S = 0.1
# The longest a new replica's warm-up request may take before it is served anyway.
WARM_UP_S = 30.0
# How often a drain reads the other gateways' reports (a Redis read each).
DRAIN_READ_S = 0.5
_NOT_PUBLISHED: tuple[type[BaseException], ...] = (LostLeadership, *REDIS_ERRORS)
PUBLISH_LUA = read_script("lease_publish.lua")


def _planned(plan: DeploymentPlan, down: set[str]) -> dict[str, tracing.Attribute]:
    """A placement's plan, as its trace step shows it."""
    return {
        "gateway.placement.nodes_down": sorted(down),
        "gateway.placement.replicas": [f"{p.model}#{p.index}@{p.node}" for p in plan.placements],
        "gateway.placement.unplaced": [f"{m}:{n}" for m, n in plan.unplaced.items() if n],
    }


def _acted(actions: Sequence[Action]) -> dict[str, tracing.Attribute]:
    return {"gateway.placement.actions": [str(action) for action in actions]}


def cluster_path(config: GatewayConfig, gateway_path: str) -> str | None:
    """The cluster file gateway.yaml names, relative to it; None when it names none."""
    if config.cluster_file is None:
        return None
    return os.path.join(os.path.dirname(gateway_path), config.cluster_file)


def replica_url(node: ClusterNode, backend: BackendKind) -> str:
    """Where a model's backend reaches the node's Triton: HTTP as given; gRPC on the
    next port (Triton's default layout, 8000 and 8001)."""
    url = node.base_url
    if backend is not BackendKind.TRITON_GRPC:
        return url
    parts = urlsplit(url)
    return f"{parts.hostname}:{(parts.port or 80) + 1}"


class ClusterPlacement:
    """Keeps the placed models' replica pools in step with the cluster's live nodes."""

    def __init__(
        self,
        cluster: ClusterConfig,
        routes: Mapping[str, ModelRoute],
        probe_interval_s: float,
        down_after: int,
        on_change: Callable[[str], None] | None = None,
        lease: PlacementLease | None = None,
        redis: RedisClient | None = None,
        autoscaler: Autoscaler | None = None,
    ) -> None:
        self.cluster = cluster
        # The closed loop (cluster.yaml's `autoscale:`), run by the leader.
        self.autoscaler = autoscaler
        self._scaler: asyncio.Task[None] | None = None
        # One move at a time: the watch (a node lost) and the loop (demand) both place,
        # and a move may wait for a drain.
        self._moving = asyncio.Lock()
        self.plan = DeploymentPlan()
        self.down: set[str] = set()
        self._routes = routes
        self._interval_s = probe_interval_s
        self._down_after = down_after
        self._on_change = on_change
        self._failures = {node.name: 0 for node in cluster.nodes}
        self._nodes = {node.name: node for node in cluster.nodes}
        self._urls = [node.base_url for node in cluster.nodes]
        self._session = LazySession(connect_timeout_s=PROBE_TIMEOUT_S)
        self._task: asyncio.Task[None] | None = None
        self._lease = lease
        self._redis = redis
        self._publish_script = redis.register_script(PUBLISH_LUA) if redis is not None else None
        self._last_token = 0  # the token this gateway last led under
        self._campaigner: asyncio.Task[None] | None = None
        self._taking_over = False  # just elected: place (from the published plan) at once
        # This gateway's id on the demand board (set by the runtime that reports): a
        # drain waits for the others' requests, not for its own stale report.
        self.gateway_id = ""
        # Deployed but not served through the gateway: placed and loaded all the same.
        self.unrouted = sorted({d.model for d in cluster.deployments} - set(routes))

    @classmethod
    def load(
        cls,
        config: GatewayConfig,
        gateway_path: str,
        routes: Mapping[str, ModelRoute],
        on_change: Callable[[str], None] | None = None,
        redis: RedisClient | None = None,
    ) -> ClusterPlacement | None:
        """The placement for gateway.yaml's cluster file, or None when it has none."""
        path = cluster_path(config, gateway_path)
        if path is None:
            return None
        lease: PlacementLease | None = None
        election = config.placement.leader_election
        if election == "redis" and redis is not None:
            lease = RedisLease(redis, config.redis.key_prefix, config.placement.lease_ttl_s)
        elif election == "kubernetes":
            from gateway_control.placement.kubernetes_lease import KubernetesLease

            lease = KubernetesLease(config.placement, config.redis.key_prefix)
        cluster = load_cluster(path)
        autoscaler = None
        if redis is not None and any(d.autoscale for d in cluster.deployments):
            board = DemandBoard(redis, config.redis.key_prefix, cluster.autoscaling.stale_after_s)
            kubernetes = cluster.autoscaling.kubernetes
            scaler = None if kubernetes is None else DeploymentScaler(kubernetes)
            autoscaler = Autoscaler(cluster, board, _slots(cluster, routes), scaler)
        return cls(
            cluster,
            routes,
            config.node_probe_interval_s,
            config.node_down_after,
            on_change,
            lease,
            redis,
            autoscaler,
        )

    @property
    def scales_to_zero(self) -> set[str]:
        """The models the closed loop may leave without a replica (min_replicas 0)."""
        return {
            d.model
            for d in self.cluster.deployments
            if d.autoscale is not None and d.autoscale.min_replicas == 0
        }

    @property
    def leading(self) -> bool:
        """Whether this gateway places (alone, or as the elected leader)."""
        return self._lease is None or self._lease.held

    async def start(self) -> None:
        """Plan, apply the plan to the nodes, serve from it, then keep watching the nodes."""
        if self.unrouted:
            log.warning("deployed, not in gateway.yaml's models: %s", ", ".join(self.unrouted))
        if self._lease is not None:
            await self._campaign_once()
            # Renewing from now on: the first placement may load models for longer than
            # the lease lasts.
            self._campaigner = asyncio.create_task(self._campaign(self._lease.ttl_ms / 3000))
        await self._probe_all()
        if self.leading:
            await self._replace()
        else:
            await self._follow()
        self._task = asyncio.create_task(self._watch())
        if self.autoscaler is not None:
            self._scaler = asyncio.create_task(self._autoscale(self.autoscaler))

    async def stop(self) -> None:
        for task in (self._task, self._campaigner, self._scaler):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._campaigner = self._scaler = None
        if self.autoscaler is not None and self.autoscaler.scaler is not None:
            await self.autoscaler.scaler.close()
        if self._lease is not None:
            # Another gateway takes over at once, not a lease's time later.
            with contextlib.suppress(LeaseUnavailable, *REDIS_ERRORS):
                await self._lease.release()
        await self._session.close()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                changed = await self._probe_all()
                if not self.leading:
                    await self._follow()
                elif changed or self.plan.unplaced or self._taking_over:
                    await self._replace()
                elif self._lease is not None:
                    # Again every round: a publish that failed once is not lost, and a
                    # stale leader's late write is replaced.
                    await self._publish_safely()
            except Exception:  # the watch must go on
                log.exception("placing the cluster's deployments failed")

    async def _autoscale(self, autoscaler: Autoscaler) -> None:
        """Every interval, on the leader: the models' desired replicas from their demand,
        placed at once when one changes."""
        while True:
            await asyncio.sleep(autoscaler.interval_s)
            if not self.leading:
                continue
            try:
                now = asyncio.get_running_loop().time()
                autoscaler.observe(self.plan, now)
                changes = await autoscaler.step(self.plan, now)
                # A change, a replica still waiting for room (a minimum runtime may have
                # passed since), or one whose load failed: place again.
                changed = await autoscaler.act(changes)
                if changed or self.plan.unplaced or autoscaler.behind(self.plan):
                    await self._replace()
                    autoscaler.observe(self.plan, now)
            except Exception:  # the loop must go on
                log.exception("autoscaling failed")

    # --- leadership ---------------------------------------------------------------------

    async def _campaign(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            was = self.leading
            try:
                await self._campaign_once()
            except Exception:  # the campaign must go on; never act on an unknown state
                assert self._lease is not None
                self._lease.token = 0
                log.exception("campaigning for the placement lease failed")
            if self.leading and not was:
                self._taking_over = True

    async def _campaign_once(self) -> None:
        assert self._lease is not None
        was, token = self._lease.held, self._lease.token
        try:
            await self._lease.campaign()
        except LeaseUnavailable as exc:
            # The lease can be neither renewed nor fenced: stop acting now.
            if was:
                log.warning("placement leader (token %d) steps down: %s", token, exc)
            return
        if self._lease.held and self._lease.token != self._last_token:
            self._last_token = self._lease.token
            log.warning(
                "placement leader: %s (token %d)",
                self._lease.holder,
                self._lease.token,
                extra={"fields": {"event": "placement_leader", "token": self._lease.token}},
            )
            await self._adopt_published()
        elif self._lease.held and not was:
            # Our own lease again after a failed renewal, under the same token: nobody
            # else led meanwhile, so our placement stands.
            log.warning("placement leader again (token %d)", self._lease.token)
        elif token and not self._lease.held:
            log.warning("placement leader (token %d) lost the lease: following", token)

    async def _publish(self) -> None:
        """Tell the other gateways the placement (only under our lease, and never over a
        newer leader's: lease_publish.lua compares the tokens)."""
        if self._lease is None or self._redis is None:
            return
        await self._lease.fence()
        assert self._publish_script is not None
        await self._publish_script(
            keys=[self._lease.keys.plan],
            args=[self._lease.token, _plan_json(self.plan, self.down, self._lease.token)],
        )

    async def _publish_safely(self) -> None:
        try:
            await self._publish()
        except _NOT_PUBLISHED as exc:
            log.warning("the placement was not published: %s", exc)

    async def _published(self) -> tuple[DeploymentPlan, set[str]] | None:
        if self._lease is None or self._redis is None:
            return None
        try:
            raw = await self._redis.get(self._lease.keys.plan)
        except REDIS_ERRORS:
            return None  # keep serving from what was published last
        return None if raw is None else _plan_from_json(raw)

    async def _adopt_published(self) -> None:
        """A new leader starts from the published placement: nothing moves for the change."""
        published = await self._published()
        if published is not None:
            self.plan, _ = published
            if self.autoscaler is not None:
                self.autoscaler.adopt(self.plan)

    async def _follow(self) -> None:
        """Serve from the leader's published placement."""
        published = await self._published()
        if published is None:
            return
        plan, _ = published
        # The leader's placement, less the nodes this gateway finds down itself (its own
        # probes: its `down` is not overwritten by the leader's view).
        self.plan = plan
        self._point_pools(lambda route, _: self._without_down_nodes(route, self._plan_urls(route)))

    async def _probe_all(self) -> bool:
        """Probe every node; True when a node went down or came back."""
        # Live, not ready: Triton is not "ready" while it loads or unloads a model.
        session = self._session.get()
        results = await asyncio.gather(
            *(get_ok(session, f"{url}/v2/health/live", PROBE_TIMEOUT_S) for url in self._urls)
        )
        changed = False
        for node, ready in zip(self.cluster.nodes, results, strict=True):
            self._failures[node.name] = 0 if ready else self._failures[node.name] + 1
            down = self._failures[node.name] >= self._down_after or (
                not ready and self._task is None  # at start: down at the first failure
            )
            if down and node.name not in self.down:
                log.warning("node %s is down: its replicas are placed elsewhere", node.name)
                self.down.add(node.name)
                changed = True
            elif ready and node.name in self.down:
                log.warning("node %s is back", node.name)
                self.down.discard(node.name)
                changed = True
        return changed

    async def _replace(self) -> None:
        """Plan again (around the nodes that are down, at the desired counts), and move
        to it without losing a request: new replicas are loaded and answer a warm-up
        request before they take traffic; replicas that go stop taking new requests here
        and on the other gateways (the published plan), drain, and only then are
        unloaded."""
        # Isolate first, even while another move drains: nothing more goes to a node
        # that is down, whatever happens next.
        self._point_pools(self._without_down_nodes)
        async with self._moving:
            await self._move()

    async def _move(self) -> None:
        cluster = (
            self.cluster if self.autoscaler is None else self.autoscaler.cluster_for(self.cluster)
        )
        protected = (
            set()
            if self.autoscaler is None
            else self.autoscaler.protected(asyncio.get_running_loop().time())
        )
        # Each placement as a trace of its own (tracing on): its plan, loads, drain, unloads.
        trace, started = tracing.begin_task("gateway.placement"), time.monotonic()
        plan = plan_deployments(cluster, down=self.down, keep=self.plan, protected=protected)
        tracing.step(trace, "gateway.placement.plan", started, _planned(plan, self.down))
        up = [n.name for n in self.cluster.nodes if n.name not in self.down]
        fence = self._lease.fence if self._lease is not None else None
        try:
            loading = time.monotonic()
            actions = await apply_plan(self.cluster, plan, nodes=up, fence=fence, unloads=False)
            await self._warm_up(plan)
            await self._serve_from(plan)
            tracing.step(trace, "gateway.placement.load", loading, _acted(actions))
            if await unloads_for(self.cluster, plan, nodes=up):
                draining = time.monotonic()
                await self._drain()
                tracing.step(trace, "gateway.placement.drain", draining)
            unloading = time.monotonic()
            unloaded = await apply_plan(self.cluster, plan, nodes=up, fence=fence, loads=False)
            tracing.step(trace, "gateway.placement.unload", unloading, _acted(unloaded))
            actions += unloaded
        except LostLeadership as exc:
            log.warning("placement stopped: %s", exc)
            if trace is not None:
                trace.end("gateway.placement", {}, "lost_leadership")
            return
        except (RepositoryError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("applying the placement failed (%s); will try again", exc)
            if trace is not None:
                trace.end("gateway.placement", {}, type(exc).__name__)
            return
        if trace is not None:
            trace.end("gateway.placement", {"gateway.placement.actions": len(actions)})
        self._taking_over = False
        for action in actions:
            log.info("placement: %s", action)
        for deployment in self.cluster.deployments:
            unplaced = plan.unplaced.get(deployment.model, 0)
            metrics.labels(metrics.REPLICAS_UNPLACED, deployment.model).set(unplaced)

    async def _warm_up(self, plan: DeploymentPlan) -> None:
        """Send each replica that `plan` adds its first request, before it takes traffic."""
        arriving = []
        for model in dict.fromkeys(d.model for d in self.cluster.deployments):
            route = self._routes.get(model)
            if route is None:
                continue
            new = set(plan.nodes_of(model)) - set(self.plan.nodes_of(model)) - self.down
            arriving += [warm_up(route, self._node_url(name, route), WARM_UP_S) for name in new]
        await asyncio.gather(*arriving)

    async def _serve_from(self, plan: DeploymentPlan) -> None:
        """Take `plan` as the placement: log a change, point the pools, publish."""
        if plan.placements != self.plan.placements or plan.unplaced != self.plan.unplaced:
            # A change is worth a warning only when something could not be placed.
            log.log(
                logging.WARNING if plan.unplaced else logging.INFO,
                "placement: %s; unplaced: %s",
                ", ".join(f"{p.model}#{p.index}@{p.node}" for p in plan.placements) or "none",
                ", ".join(f"{m} x{n}" for m, n in sorted(plan.unplaced.items())) or "none",
            )
        self.plan = plan
        self._point_pools(lambda route, _: self._plan_urls(route))
        await self._publish_safely()

    async def _drain(self) -> None:
        """Wait until no request is left on a replica the placement took out (on a node
        up), up to `autoscaling.drain_timeout_s`: none of this gateway's, and none of
        the other gateways' (each fresh report on the demand board serves from this
        placement and has none left); and at least two probe intervals, the time the
        others take to follow the published plan when they do not report. A new leader
        drains this way what the last one left loaded, too."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = self.cluster.autoscaling.drain_timeout_s
        followed = started + 2 * self._interval_s
        digest = placement_digest(self.plan)
        others_done, read_at = False, 0.0
        while loop.time() - started < timeout:
            mine = self._left_on_leaving(self.moves()[1])
            if mine == 0 and loop.time() >= followed:
                if not others_done and loop.time() - read_at >= DRAIN_READ_S:
                    read_at = loop.time()
                    others_done = await self.others_drained(digest)
                if others_done:
                    return
            await asyncio.sleep(DRAIN_POLL_S)
        log.warning(
            "drain: requests still on replicas that leave after %.0f s (%d of this "
            "gateway's); unloading", timeout, self._left_on_leaving(self.moves()[1]),
        )  # fmt: skip

    def _left_on_leaving(self, draining: Mapping[str, Mapping[str, int]]) -> int:
        """Requests in `draining` (model -> URL -> count) on replicas that the current
        placement does not serve, on nodes up (a node down unloads nothing)."""
        left = 0
        for model, urls in draining.items():
            route = self._routes.get(model)
            if route is None:
                continue
            keep = set(self._plan_urls(route)) | {self._node_url(n, route) for n in self.down}
            left += sum(count for url, count in urls.items() if url not in keep)
        return left

    async def others_drained(self, digest: str) -> bool:
        """Whether every other gateway that reports serves from placement `digest` and
        has no request left on a replica it does not serve. Without reports (no loop,
        or Redis unreadable), the probe intervals waited are all there is to go by."""
        board = None if self.autoscaler is None else self.autoscaler.board
        if board is None:
            return True
        try:
            reports = await board.read()
        except REDIS_ERRORS:
            return True
        for report in reports:
            if report.gateway == self.gateway_id:
                continue
            if report.plan != digest or self._left_on_leaving(report.draining):
                return False
        return True

    def moves(self) -> tuple[str, dict[str, dict[str, int]]]:
        """For this gateway's demand report: the placement it serves from, and its
        requests still on replicas that placement took out (model -> URL -> count)."""
        draining = {}
        for model, route in self._routes.items():
            left = route.pool.draining()
            if left:
                draining[model] = left
        return placement_digest(self.plan), draining

    def _node_url(self, name: str, route: ModelRoute) -> str:
        return replica_url(self._nodes[name], route.config.backend)

    def _without_down_nodes(self, route: ModelRoute, urls: list[str]) -> list[str]:
        down = {self._node_url(name, route) for name in self.down}
        return [url for url in urls if url not in down]

    def _plan_urls(self, route: ModelRoute) -> list[str]:
        # A node hosting two replicas of a model is still one endpoint.
        hosts = dict.fromkeys(self.plan.nodes_of(route.name))
        return [self._node_url(name, route) for name in hosts]

    def _point_pools(self, urls_for: Callable[[ModelRoute, list[str]], list[str]]) -> None:
        """Give each placed model's pool the URLs `urls_for(route, current urls)`."""
        for model in dict.fromkeys(d.model for d in self.cluster.deployments):
            route = self._routes.get(model)
            if route is None:
                continue
            current = [r.url for r in route.pool.replicas]
            urls = urls_for(route, current)
            if urls == current:
                continue
            kind = route.config.backend
            route.pool.set_urls(urls, [default_metrics_url(kind, url) for url in urls])
            if self._on_change is not None:
                self._on_change(route.name)


def _slots(cluster: ClusterConfig, routes: Mapping[str, ModelRoute]) -> dict[str, int]:
    """Requests one replica of each autoscaled model serves at once: its `autoscale`'s
    `slots_per_replica`, else its route's `max_in_flight_per_replica`, else 1."""
    slots = {}
    for deployment in cluster.deployments:
        scale = deployment.autoscale
        if scale is None:
            continue
        route = routes.get(deployment.model)
        per_route = route.config.queue.max_in_flight_per_replica if route is not None else 1
        slots[deployment.model] = scale.slots_per_replica or per_route
    return slots


def placement_digest(plan: DeploymentPlan) -> str:
    """A short name of where every replica runs: two gateways that serve from the same
    placement have the same."""
    where = sorted((p.model, p.index, p.node) for p in plan.placements)
    return hashlib.sha256(json.dumps(where).encode()).hexdigest()[:16]


def _plan_json(plan: DeploymentPlan, down: set[str], token: int) -> str:
    return json.dumps({
        "token": token,
        "placements": [[p.model, p.index, p.node, list(p.gpus)] for p in plan.placements],
        "unplaced": plan.unplaced,
        "down": sorted(down),
    })  # fmt: skip


def _plan_from_json(raw: bytes | str) -> tuple[DeploymentPlan, set[str]] | None:
    try:
        data = json.loads(raw)
        placements = [
            ReplicaPlacement(str(model), int(index), str(node), tuple(int(g) for g in gpus))
            for model, index, node, gpus in data["placements"]
        ]
        unplaced = {str(k): int(v) for k, v in data["unplaced"].items()}
        return DeploymentPlan(placements, unplaced), {str(n) for n in data["down"]}
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("the published placement cannot be read: %s", exc)
        return None
