"""The parts of other programs a server uses when its config asks, found by entry point.

A cluster file (`cluster_file` in gateway.yaml) is the control plane's (`gateway_control`):
the server checks it and places replicas on its nodes only through what the entry points
of group `inference_gateway.cluster` (pyproject.toml) name, never by importing it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

CLUSTER_GROUP = "inference_gateway.cluster"
NOT_INSTALLED = "a cluster file needs the control plane (gateway_control), which is not installed"


def cluster_part(name: str) -> Any | None:
    """The object the cluster group's entry point `name` names; None when no installed
    program provides one."""
    found = entry_points(group=CLUSTER_GROUP, name=name)
    return next(iter(found)).load() if found else None
