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
    program provides one (a build of the server alone still declares the entry points:
    its metadata comes from pyproject.toml, whatever the tree held)."""
    for found in entry_points(group=CLUSTER_GROUP, name=name):
        try:
            return found.load()
        except ModuleNotFoundError as exc:
            if exc.name != found.module.partition(".")[0]:
                raise  # the program is there and broken: say so
    return None
