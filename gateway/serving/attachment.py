"""What another program may attach to a running server, and what the server shows it.

The server never imports the control plane (`gateway_control`): when gateway.yaml names
a cluster file, the part that places replicas there is found by its entry point
(`gateway.config.extensions`) and handed a `ServerView`: the
models' routes (whose replica pools it points), the admission controller (whose counts
it reports as demand) and the shared Redis. The server starts and stops what it returns,
and learns from it which models may have no replica at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.admission import AdmissionController
from gateway.config import Config
from gateway.config.extensions import NOT_INSTALLED, cluster_part
from gateway.storage.redis_client import RedisClient
from gateway.upstream.route import ModelRoute


@dataclass(frozen=True)
class ServerView:
    """The parts of a server an attachment may use."""

    config: Config
    routes: Mapping[str, ModelRoute]
    admission: AdmissionController
    redis: RedisClient
    # Call with a model's name when its replicas change (its slots are recounted).
    capacity_changed: Callable[[str], None]


class Attachment(Protocol):
    """A part of another program running in the server's process."""

    @property
    def scales_to_zero(self) -> set[str]:
        """Models that may have no replica: their requests wait for the first one."""
        ...

    async def start(self) -> None:
        """Begin (before the server takes traffic)."""
        ...

    async def stop(self) -> None:
        """End (after the server's last request)."""
        ...


class Attach(Protocol):
    """What the entry point names: builds the attachment for a server, or None when the
    config asks for nothing of it."""

    def __call__(self, server: ServerView) -> Attachment | None: ...


def cluster_attachment(server: ServerView) -> Attachment | None:
    """The control plane attached to `server` when its config names a cluster file."""
    if server.config.gateway.cluster_file is None:
        return None
    attach: Attach | None = cluster_part("attach")
    if attach is None:  # the config's check refuses this first
        raise RuntimeError(NOT_INSTALLED)
    return attach(server)
