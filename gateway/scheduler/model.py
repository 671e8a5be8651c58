"""TEMPORARY alias of `gateway.scheduler.cluster` (the GPU cluster model, renamed).

Only the runtime modules being moved out of this package (deployment.py, and
tests/unit/test_scheduler_deployment.py) still import this path. Delete this file once
they import `gateway.scheduler.cluster`; nothing in the laboratory uses it.
"""

from gateway.scheduler.cluster import GPU_MILLI, Cluster, Node, Placement, Pod

__all__ = ["GPU_MILLI", "Cluster", "Node", "Placement", "Pod"]
