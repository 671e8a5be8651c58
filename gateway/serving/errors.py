"""Why the conductor did not serve a request, in the serving layer's own words.

`gateway.api.errors.client_error` alone turns each into what the client is told (its
status, OpenAI's or Anthropic's error body, `Retry-After`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.ratelimit.decisions import Decision


class InvalidRequest(Exception):
    """The request asks for what cannot be served as asked (a 400): `param` names the
    field or header at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UnknownModel(Exception):
    """No model or alias answers to the name a request sent (as sent)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class ModelNotAllowed(Exception):
    """The caller's tenant may not use the model it named."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class WrongModelKind(Exception):
    """An embedding model asked for text (`embedding` true), or a text model for vectors."""

    def __init__(self, model: str, *, embedding: bool) -> None:
        super().__init__(model)
        self.model = model
        self.embedding = embedding


class RateLimited(Exception):
    """The tenant's limits refuse the request now (or ever: `decision.never_fits`)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.refused_by)
        self.decision = decision


class InvalidStructuredOutput(Exception):
    """The model's answer is not the JSON `response_format` asked for."""

    def __init__(self, model: str, problem: str) -> None:
        super().__init__(problem)
        self.model = model
        self.problem = problem


class NotServed(Exception):
    """The dispatcher could not serve the request on `model`: `cause` says why (a full
    queue, a deadline, no replica, the upstream's failure). `headers` are the rate-limit
    headers of the admission it had."""

    def __init__(self, model: str, cause: Exception, headers: dict[str, str]) -> None:
        super().__init__(str(cause))
        self.model = model
        self.cause = cause
        self.headers = headers


class IdempotencyKeyInUse(Exception):
    """A request under the same Idempotency-Key is still running: retry after
    `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("in use")
        self.retry_after_s = retry_after_s


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key was used with a different request."""
