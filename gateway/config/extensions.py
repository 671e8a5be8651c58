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


def installed_parts(group: str, name: str | None = None) -> list[Any]:
    """The objects the entry points of `group` (those called `name`, if given) name, of
    the programs that are installed: a build that leaves a program out still declares its
    entry points (its metadata comes from pyproject.toml, whatever the tree held)."""
    found = entry_points(group=group) if name is None else entry_points(group=group, name=name)
    parts = []
    for point in found:
        try:
            parts.append(point.load())
        except ModuleNotFoundError as exc:
            if exc.name != point.module.partition(".")[0]:
                raise  # the program is there and broken: say so
    return parts


def cluster_part(name: str) -> Any | None:
    """The object the cluster group's entry point `name` names; None when no installed
    program provides one."""
    parts = installed_parts(CLUSTER_GROUP, name)
    return parts[0] if parts else None
