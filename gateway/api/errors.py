"""OpenAI-shaped errors (`{"error": {"message", "type", "param", "code"}}`), and the one
mapping of every refusal the layers below raise to the error the client is told
(`client_error`)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from gateway.admission import Overloaded, ReplicaStarting, Shed
from gateway.backends.base import UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.inference.prompt import PromptRefused
from gateway.ratelimit.errors import LimiterUnavailable, UnknownTenant
from gateway.serving.auth import InvalidApiKey
from gateway.serving.chain import ContextTooLong, MissingCapability
from gateway.serving.conductor import shown_model
from gateway.serving.dispatch import DeadlineCut, DeadlineMissed
from gateway.serving.errors import (
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidRequest,
    InvalidStructuredOutput,
    ModelNotAllowed,
    NotServed,
    RateLimited,
    UnknownModel,
    WrongModelKind,
)
from gateway.serving.outbound import SensitiveDataBlocked
from gateway.storage.response_store import StoreFull
from gateway.transport.errors import APIError as APIError  # the shape, shared with transport
from gateway.upstream.failover import NoReplicaLeft

if TYPE_CHECKING:
    from gateway.ratelimit.decisions import Decision

log = logging.getLogger("gateway")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def renamed(error: APIError, default: str, *renames: tuple[str, str]) -> APIError:
    """A 400 from a parser shared with another API, naming the field as this API calls
    it: each `(old, new)` replaced in turn in its param (`default` if it names none) and
    in its message."""
    param = error.param or default
    ours = param
    for old, new in renames:
        ours = ours.replace(old, new)
    return bad_request(error.message.replace(param, ours), ours)


def invalid_api_key() -> APIError:
    return APIError(
        401,
        "Incorrect API key provided. Pass it as `Authorization: Bearer KEY`.",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def sensitive_data_blocked(model: str, categories: list[str]) -> APIError:
    """The request holds what may not leave the cluster for `model`: the categories found,
    never the values."""
    return APIError(
        400,
        f"The request was not sent to `{model}`, which runs outside the cluster: it holds "
        f"{', '.join(categories)}. Remove that data and send it again.",
        code="sensitive_data_blocked",
    )


def context_length_exceeded(model: str, limit: int, prompt: int, completion: int) -> APIError:
    """OpenAI's error for a request longer than the model's context, in its words."""
    return APIError(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
        f"completion). Please reduce the length of the messages or completion. "
        f"(model `{model}`; prompt tokens are the gateway's estimate)",
        param="messages",
        code="context_length_exceeded",
    )


def unsupported_parameter(model: str, param: str) -> APIError:
    """The request uses what the model cannot do (`capabilities` in gateway.yaml)."""
    return APIError(
        400,
        f"The model `{model}` does not support `{param}`.",
        param=param,
        code="unsupported_parameter",
    )


def wrong_model_kind(model: str, *, embedding: bool) -> APIError:
    """An embedding model asked for text, or a text model asked for vectors."""
    message = (
        f"`{model}` is an embedding model: use /v1/embeddings."
        if embedding
        else f"`{model}` is not an embedding model: /v1/embeddings needs one."
    )
    return APIError(400, message, param="model", code="model_not_supported")


def invalid_structured_output(model: str, problem: str) -> APIError:
    """The model's answer is not the JSON `response_format` asked for."""
    return APIError(
        502,
        f"`{model}` answered with output that `response_format` does not allow: {problem}.",
        type="server_error",
        code="invalid_structured_output",
        # The same request is likely to get the same answer: the SDKs should not retry it
        # (their three tries would be charged three times).
        headers={"x-should-retry": "false"},
    )


def model_not_found(model: str) -> APIError:
    """The 404 of a model name no model or alias answers to, the name as sent (redacted,
    cut)."""
    return APIError(
        404,
        f"The model `{shown_model(model)}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def model_not_allowed(model: str) -> APIError:
    return APIError(
        403,
        f"Your API key is not allowed to use the model `{model}`.",
        type="permission_error",
        param="model",
        code="model_not_allowed",
    )


def body_too_large(limit: int) -> APIError:
    # The rest of the body is not read: the connection cannot carry another request, and
    # a client that keeps it must be told so, or it sends its next one into a closed one.
    return APIError(
        413,
        f"Request body is larger than the limit of {limit} bytes.",
        code="request_too_large",
        headers={"connection": "close"},
    )


def no_replica(model: str, retry_after_s: float = 1.0) -> APIError:
    return APIError(
        503,
        f"No healthy replica of `{model}` can take the request right now.",
        type="server_error",
        code="no_replica_available",
        retry_after_s=retry_after_s,
        reason="no_replica",
    )


def upstream_failed(model: str, detail: str) -> APIError:
    return APIError(
        502,
        f"The backend for `{model}` failed: {detail}",
        type="server_error",
        code="upstream_error",
    )


def upstream_timeout(model: str) -> APIError:
    return APIError(
        504,
        f"The backend for `{model}` did not answer in time.",
        type="server_error",
        code="timeout",
    )


def rate_limited(decision: Decision) -> APIError:
    """The 429 for a refused request, with the bucket headers and how long to wait."""
    headers = dict(decision.headers)
    if decision.refused_by == "spend":
        return over_budget(decision, headers)
    kind = "tokens" if decision.refused_by == "tokens" else "requests"
    if decision.never_fits:
        whose = "this API key's" if decision.of_key else "your"
        message = (
            f"This request needs more tokens than {whose} token limit can ever hold; "
            "lower max_tokens or shorten the prompt."
        )
        headers["x-should-retry"] = "false"  # the openai SDK honours this
    elif decision.refused_by == "concurrency":
        message = (
            f"Too many requests in flight for your organization (at most {decision.limit} at "
            "once); wait for one to finish."
        )
    else:
        # The SDKs show the message, not the headers: it says the limit and the wait.
        wait = max(1, math.ceil(decision.retry_after_s or 0))
        whose = "this API key" if decision.of_key else "your organization"
        message = (
            f"Rate limit reached: {decision.limit} {kind} per minute for {whose}; "
            f"retry in {wait} s."
        )
    reason = {"tokens": "rate_tokens", "concurrency": "concurrency"}.get(
        decision.refused_by or "", "rate_requests"
    )
    return APIError(
        429,
        message,
        type=kind,
        code="rate_limit_exceeded",
        retry_after_s=decision.retry_after_s,
        headers=headers,
        reason=reason,
    )


_PERIOD_NAMES = {"day": "daily", "month": "monthly", "total": "total"}


def over_budget(decision: Decision, headers: dict[str, str]) -> APIError:
    """The 429 `insufficient_quota` of a request whose most possible cost is more than
    is left of a budget: OpenAI's answer to an account out of credit."""
    period = _PERIOD_NAMES.get(decision.period or "", "")
    left = headers.get("x-budget-remaining", "0")
    limit = headers.get("x-budget-limit", "")
    message = (
        f"You exceeded your current quota: this request may cost more than is left of "
        f"your {period} budget ({left} of {limit} left)."
    )
    if decision.period == "total":
        message += " It does not renew: ask your operator to raise it."
    elif decision.retry_after_s is None:
        # More than the whole budget: waiting for the next period would not help.
        message += (
            " This request may cost more than the whole budget: lower max_tokens or "
            "shorten the prompt."
        )
    else:
        message += " It renews at the start of the next period; a smaller max_tokens may fit now."
    # The SDKs retry a 429 within seconds: no use before the period ends.
    headers["x-should-retry"] = "false"
    return APIError(
        429,
        message,
        type="insufficient_quota",
        code="insufficient_quota",
        retry_after_s=decision.retry_after_s,
        headers=headers,
        reason="budget",
    )


def stored_responses_full(full: StoreFull) -> APIError:
    """The 429 of a request whose answer its tenant's stored responses have no room for."""
    if full.quota == "max_bytes":
        held = f"{full.used:,} of {full.limit:,} bytes, and this answer needs {full.need:,} more"
    else:
        held = f"{full.used:,} of {full.limit:,} responses"
    return APIError(
        429,
        f"Your stored responses are at their quota: {held} (`stored_responses.{full.quota}` "
        "of your tenant). Delete some (DELETE /v1/responses/{id}; another key's, your "
        "tenant's admin can: DELETE /admin/responses/{id}), wait for them to expire, or "
        "send `store: false`.",
        type="insufficient_quota",
        param="store",
        code="stored_responses_quota_exceeded",
        # The SDKs retry a 429 within seconds: no use until responses expire or go.
        headers={"x-should-retry": "false"},
        reason="stored_responses_quota",
    )


def overloaded(model: str, retry_after_s: float, *, shed: bool) -> APIError:
    """503 for a full queue, or for a queued request that gave way to a higher class."""
    if shed:
        message = (
            f"`{model}` is saturated and your request gave way to higher-priority work; "
            "retry after the indicated time."
        )
    else:
        message = f"`{model}` is overloaded (its queue is full); retry after the indicated time."
    return APIError(
        503,
        message,
        type="server_error",
        code="shed" if shed else "model_overloaded",
        retry_after_s=retry_after_s,
        reason="shed" if shed else "queue_full",
    )


def deadline_exceeded(detail: str) -> APIError:
    return APIError(
        504,
        f"The request could not be answered before its deadline: {detail}.",
        type="server_error",
        code="deadline_exceeded",
        reason="deadline",
    )


def limiter_unavailable(retry_after_s: float) -> APIError:
    return APIError(
        503,
        "Rate limits cannot be checked right now; try again shortly.",
        type="server_error",
        code="rate_limiter_unavailable",
        retry_after_s=retry_after_s,
        reason="limiter_unavailable",
    )


# The errors of the layers below that a client is told about, as they are told.
DOMAIN_ERRORS = (
    InvalidApiKey,
    UnknownTenant,
    LimiterUnavailable,
    SensitiveDataBlocked,
    MissingCapability,
    ContextTooLong,
    InvalidRequest,
    UnknownModel,
    ModelNotAllowed,
    WrongModelKind,
    RateLimited,
    InvalidStructuredOutput,
    NotServed,
    StoreFull,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    PromptRefused,
)
# What `client_error` takes: an error already the client's, or one of the layers below.
CLIENT_ERRORS = (APIError, *DOMAIN_ERRORS)


def client_error(exc: Exception) -> APIError:
    """The APIError for `exc`: itself, or what one of `DOMAIN_ERRORS` means to a client."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequest):
        return bad_request(exc.message, exc.param)
    if isinstance(exc, RateLimited):
        return rate_limited(exc.decision)
    if isinstance(exc, NotServed):
        error = dispatch_error(exc.model, exc.cause)
        if exc.headers:
            error.headers = {**exc.headers, **error.headers}
        return error
    if isinstance(exc, UnknownModel):
        return model_not_found(exc.model)
    if isinstance(exc, ModelNotAllowed):
        return model_not_allowed(exc.model)
    if isinstance(exc, WrongModelKind):
        return wrong_model_kind(exc.model, embedding=exc.embedding)
    if isinstance(exc, InvalidStructuredOutput):
        return invalid_structured_output(exc.model, exc.problem)
    if isinstance(exc, InvalidApiKey | UnknownTenant):
        # A tenant a reload removed after its key was checked: its key is unknown now.
        return invalid_api_key()
    if isinstance(exc, LimiterUnavailable):
        return limiter_unavailable(exc.retry_after_s)
    if isinstance(exc, SensitiveDataBlocked):
        return sensitive_data_blocked(exc.model, exc.categories)
    if isinstance(exc, MissingCapability):
        return unsupported_parameter(exc.model, exc.field)
    if isinstance(exc, StoreFull):
        return stored_responses_full(exc)
    if isinstance(exc, IdempotencyKeyInUse):
        return APIError(
            409,
            "A request with this Idempotency-Key is still running; retry later.",
            code="idempotency_key_in_use",
            retry_after_s=exc.retry_after_s,
        )
    if isinstance(exc, IdempotencyKeyReused):
        return APIError(
            422,
            "This Idempotency-Key was used with a different request.",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    if isinstance(exc, PromptRefused):
        return bad_request(
            f"The chat template of `{exc.model}` refused these messages: {exc.message}",
            "messages",
        )
    if isinstance(exc, ContextTooLong):
        return context_length_exceeded(
            exc.model, exc.limit, exc.prompt_tokens, exc.completion_tokens
        )
    raise TypeError(f"not a client error: {exc!r}")


def dispatch_error(model: str, exc: Exception) -> APIError:
    """What the client is told when the dispatcher could not serve its request on `model`."""
    if isinstance(exc, ReplicaStarting):
        return APIError(
            503,
            f"`{model}` has no replica running yet (it scaled to zero when idle); its first "
            "one is starting: retry after the indicated time.",
            type="server_error",
            code="model_starting",
            retry_after_s=exc.retry_after_s,
            reason="model_starting",
        )
    if isinstance(exc, Shed):
        return overloaded(model, exc.retry_after_s, shed=True)
    if isinstance(exc, Overloaded):
        return overloaded(model, exc.retry_after_s, shed=False)
    if isinstance(exc, (DeadlineMissed, DeadlineCut)):
        return deadline_exceeded(str(exc))
    if isinstance(exc, NoReplicaLeft):
        return no_replica(model)
    if isinstance(exc, UpstreamTimeout):
        return upstream_timeout(model)
    if isinstance(exc, UpstreamRejected) and 400 <= exc.status < 500:
        return bad_request(f"The backend for `{model}` refused the request: {exc}")
    return upstream_failed(model, str(exc))


def stream_failure(model: str, exc: Exception) -> APIError:
    """What a stream's terminal error event says of a failure after its headers."""
    if isinstance(exc, UpstreamError | NoReplicaLeft):
        return dispatch_error(model, exc)
    # A bug, or an upstream that sent what no backend expects: still a terminal event.
    log.exception("stream of %s failed", model)
    return APIError(500, "The gateway failed while streaming the answer.", type="server_error")
