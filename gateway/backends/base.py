"""What every backend offers, and the failures it reports."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from gateway.inference.types import Completion, Delta, UpstreamCall


class UpstreamError(Exception):
    """The upstream failed the request."""

    #: Another replica may succeed (connection refused or reset, 503, model not loaded).
    retryable = False


class ReplicaUnavailable(UpstreamError):
    """The replica could not take the request; nothing was generated."""

    retryable = True


class UpstreamRejected(UpstreamError):
    """The upstream refused the request itself (bad input); retrying elsewhere will not help."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def model_error(message: str, before_output: bool) -> UpstreamError:
    """A model's own error reported in a Triton response. Before any output, it is the
    model refusing the request (Triton's HTTP frontend answers that with a 400): a client
    error, not the replica's fault. After output started, the generation failed."""
    detail = f"model error: {message[:300]}"
    return UpstreamRejected(detail) if before_output else UpstreamError(detail)


class UpstreamTimeout(UpstreamError):
    """No answer in the time allowed."""


class Backend(Protocol):
    """Talks to the replicas of models served by one kind of server."""

    #: Whether chat requests go upstream as a prompt rendered by the model's template
    #: (Triton), rather than as the messages themselves (OpenAI-compatible servers).
    renders_prompt: bool

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        """Run the request to completion on the replica at `url`."""
        ...

    def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        """Generate the request's output piece by piece on the replica at `url`."""
        ...

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        """Whether the replica at `url` has the model loaded and ready."""
        ...

    async def close(self) -> None:
        """Release pooled connections."""
        ...
