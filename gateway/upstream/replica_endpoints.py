"""What a model's replicas are looked up as: an `Endpoint` (host and port), from an
`EndpointSource` (DNS, or a Service's EndpointSlices), which raises `LookupFailed` when
it has none to give."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One address a model's replica answers on."""

    host: str
    port: int


class LookupFailed(Exception):
    """The source did not answer with any replica."""


class EndpointSource(Protocol):
    """Where one model's replicas are looked up."""

    async def endpoints(self) -> list[Endpoint]:
        """The endpoints now, sorted; LookupFailed when there are none to be had."""
        ...

    async def close(self) -> None: ...
