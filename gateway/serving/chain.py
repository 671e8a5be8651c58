"""Which models may serve a request: the model asked for, then those of its fallbacks
that the tenant may use, that have every capability the request uses (tools,
structured outputs, log probabilities) and that have room for it in their context."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import BackendKind
from gateway.inference.tokens import estimate_request_tokens
from gateway.inference.types import InferenceRequest
from gateway.serving.auth import Identity
from gateway.upstream.route import ModelRoute


class MissingCapability(Exception):
    """The model asked for cannot serve a field of the request (`capabilities`)."""

    def __init__(self, model: str, field: str) -> None:
        super().__init__(model, field)
        self.model, self.field = model, field


class ContextTooLong(Exception):
    """The prompt and the completion cannot fit the model's context."""

    def __init__(self, model: str, limit: int, prompt_tokens: int, completion_tokens: int):
        super().__init__(model, limit, prompt_tokens, completion_tokens)
        self.model, self.limit = model, limit
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens


def fallback_chain(
    routes: Mapping[str, ModelRoute],
    identity: Identity,
    route: ModelRoute,
    request: InferenceRequest,
) -> list[ModelRoute]:
    """`route`, then its fallbacks that may serve `request`; MissingCapability when
    `route` itself cannot."""
    fallbacks = [routes[name] for name in route.config.fallback if identity.may_use(name)]
    options = request.options
    if uses_tools(request) or options.response_format or options.top_logprobs is not None:
        missing = missing_capability(route, request)
        if missing is not None:
            raise MissingCapability(route.name, missing)
        fallbacks = [r for r in fallbacks if missing_capability(r, request) is None]
    if any(r.config.context_length is not None for r in fallbacks):
        # The messages' own estimate (each fallback renders its own prompt, a few
        # tokens apart): a fallback the request cannot fit is left out.
        tokens = estimate_request_tokens(request)
        fallbacks = [r for r in fallbacks if _fits(r, tokens, request)]
    return [route, *fallbacks]


def uses_tools(request: InferenceRequest) -> bool:
    """Whether the request offers tools or carries tool calls or results."""
    return bool(request.options.tools) or any(
        m.tool_calls or m.tool_call_id is not None for m in request.messages
    )


def missing_capability(route: ModelRoute, request: InferenceRequest) -> str | None:
    """The field of the request that `route`'s model cannot serve, if any."""
    capabilities, options = route.config.capabilities, request.options
    if not capabilities.tools and uses_tools(request):
        return "tools"
    if not capabilities.structured_outputs and options.response_format is not None:
        return "response_format"
    if not capabilities.logprobs and options.top_logprobs is not None:
        return "logprobs"
    if options.top_logprobs and route.config.backend is not BackendKind.OPENAI:
        return "top_logprobs"  # Triton models give the chosen tokens' only
    return None


def check_context(route: ModelRoute, prompt_tokens: int, request: InferenceRequest) -> None:
    """ContextTooLong unless the prompt and the completion fit the model's context."""
    limit = route.config.context_length
    if limit is not None and not _fits(route, prompt_tokens, request):
        raise ContextTooLong(route.name, limit, prompt_tokens, request.params.max_tokens)


def _fits(route: ModelRoute, prompt_tokens: int, request: InferenceRequest) -> bool:
    limit = route.config.context_length
    return limit is None or prompt_tokens + request.params.max_tokens <= limit
