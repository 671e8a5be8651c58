"""What a running gateway reports about its queues and replicas, for `/metrics`.

`observability.metrics` asks a `StateSource` for these samples at scrape time (and after
each health-check round, with several workers); this is the one the app wires in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from gateway.admission import AdmissionController
from gateway.observability import metrics
from gateway.observability.metrics import StateSample
from gateway.upstream.outlier import ReplicaState
from gateway.upstream.route import ModelRoute


class GatewayState:
    """The admission queues and the replicas of each model route."""

    def __init__(self, admission: AdmissionController, routes: Iterable[ModelRoute]) -> None:
        self._admission = admission
        self._routes = {route.name: route for route in routes}

    def models(self) -> Collection[str]:
        return self._routes.keys()

    def samples(self, model: str) -> Iterator[StateSample]:
        route = self._routes[model]
        snapshot = self._admission.snapshot(route.name)
        yield metrics.ADMISSION_IN_FLIGHT, [route.name], snapshot.in_flight
        for priority, count in snapshot.queued.items():
            yield metrics.ADMISSION_QUEUED, [route.name, priority], count
        outlier = route.resilience.outlier
        for replica in route.pool.replicas:
            labels = [route.name, replica.url]
            yield metrics.REPLICA_HEALTHY, labels, 1 if replica.healthy else 0
            ejected = outlier.state(replica) is ReplicaState.EJECTED
            yield metrics.REPLICA_EJECTED, labels, 1 if ejected else 0
            yield metrics.REPLICA_IN_FLIGHT, labels, replica.outstanding
            if replica.metrics_url is not None:
                yield metrics.TRITON_PENDING, labels, replica.upstream_pending
                yield metrics.TRITON_QUEUE_TIME, labels, replica.upstream_queue_seconds

    def replica_urls(self, model: str) -> Iterable[str]:
        return [replica.url for replica in self._routes[model].pool.replicas]
