"""Why a request was not admitted."""

from __future__ import annotations


class Overloaded(Exception):
    """The model's queue was full and nothing of a lower class could make room.

    `retry_after_s` is how long the queue ahead of this request should take to drain, from
    the model's measured drain rate.
    """

    def __init__(self, model: str, priority: str, retry_after_s: float) -> None:
        super().__init__(
            f"{model} is overloaded for {priority} requests; retry after {retry_after_s:.3g} s"
        )
        self.model = model
        self.priority = priority
        self.retry_after_s = retry_after_s


class Shed(Overloaded):
    """The request was queued, then evicted to make room for one of a higher class."""

    def __init__(self, model: str, priority: str, retry_after_s: float) -> None:
        super().__init__(model, priority, retry_after_s)
        self.args = (
            f"{priority} request to {model} was shed for a higher class; "
            f"retry after {retry_after_s:.3g} s",
        )


class ReplicaStarting(Overloaded):
    """The model has no replica (it scaled to zero) and none was ready by the request's
    deadline: its first one is being started."""

    def __init__(self, model: str, priority: str, retry_after_s: float) -> None:
        super().__init__(model, priority, retry_after_s)
        self.args = (f"{model} has no replica yet; retry after {retry_after_s:.3g} s",)


class DeadlineExceeded(Exception):
    """The request's deadline passed while it was still queued (or before it could queue)."""

    def __init__(self, model: str, priority: str, waited_s: float) -> None:
        super().__init__(
            f"{priority} request to {model} reached its deadline after {waited_s:.3g} s queued"
        )
        self.model = model
        self.priority = priority
        self.waited_s = waited_s
