"""A configured model, ready to serve: its backend, replicas and prompt template."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import Backend
from gateway.config import BackendKind, ModelConfig
from gateway.inference.prompt import DEFAULT_MAX_PROMPT_CHARS, PromptRefused, PromptTemplate
from gateway.inference.tokens import (
    estimate_chat_tokens,
    estimate_request_tokens,
    estimate_tokens,
)
from gateway.inference.tool_parsers import TOOL_PARSERS, ToolParser
from gateway.inference.types import InferenceRequest, RequestKind, UpstreamCall
from gateway.upstream.backoff import Backoff
from gateway.upstream.budget import RetryBudget
from gateway.upstream.latency import LatencyTracker
from gateway.upstream.outlier import OutlierDetector
from gateway.upstream.pool import ReplicaPool


@dataclass(frozen=True, slots=True)
class RouteResilience:
    """One model's defences: retry pacing, retry budget, outlier ejection, latency stats."""

    backoff: Backoff
    budget: RetryBudget
    outlier: OutlierDetector
    latency: LatencyTracker

    @classmethod
    def for_model(cls, config: ModelConfig, pool: ReplicaPool) -> RouteResilience:
        retry, outlier = config.retry, config.outlier
        return cls(
            backoff=Backoff(retry.backoff_base_s, retry.backoff_cap_s),
            budget=RetryBudget(retry.budget_ratio, retry.budget_min_per_s, retry.budget_window_s),
            outlier=OutlierDetector(
                outlier.consecutive_failures,
                outlier.base_ejection_s,
                outlier.max_ejection_s,
                replicas=pool.replicas,
            ),
            latency=LatencyTracker(),
        )


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    config: ModelConfig
    backend: Backend
    pool: ReplicaPool
    template: PromptTemplate
    resilience: RouteResilience

    @property
    def tool_parser(self) -> ToolParser | None:
        """How this model's calls are read from its text, if it writes them as text."""
        name = self.config.capabilities.tool_parser
        return None if name is None else TOOL_PARSERS[name.value]

    @property
    def upstream_model(self) -> str:
        return self.config.upstream_model or self.name

    def upstream_call(self, request: InferenceRequest) -> UpstreamCall:
        """The request as this model's backend receives it."""
        if request.kind is RequestKind.EMBEDDING:
            return self._embedding_call(request)
        if request.kind is not RequestKind.CHAT:
            prompt, estimate = request.prompt, estimate_tokens(request.prompt)
        elif self.backend.renders_prompt:
            prompt = self._render(request)
            estimate = estimate_tokens(prompt)
        else:
            # The server renders the messages itself: no need to render them here.
            prompt, estimate = "", estimate_chat_tokens(request.messages, request.options.tools)
        return UpstreamCall(
            kind=request.kind,
            upstream_model=self.upstream_model,
            prompt=prompt,
            messages=request.messages,
            params=request.params,
            prompt_estimate=estimate,
            options=request.options,
            session=request.session,
        )

    @property
    def prompt_limit(self) -> int:
        """The longest prompt this model's template may make: 16 characters a token of its
        context (a prompt that long is refused for its length anyway), or the default."""
        context = self.config.context_length
        return DEFAULT_MAX_PROMPT_CHARS if context is None else 16 * context

    def _render(self, request: InferenceRequest) -> str:
        """The chat's prompt in this model's template."""
        options = request.options
        limit = self.prompt_limit
        try:
            if options.tools and options.tool_choice != "none":
                required = options.forced_tool or (
                    "one of the functions" if options.tool_choice == "required" else None
                )
                return self.template.render(request.messages, options.tools, required, limit)
            return self.template.render(request.messages, max_chars=limit)
        except PromptRefused as exc:
            raise PromptRefused(exc.message, self.name) from None

    def _embedding_call(self, request: InferenceRequest) -> UpstreamCall:
        embeddings = self.config.capabilities.embeddings
        tensors = (
            ("text_input", "embedding")
            if embeddings is None
            else (embeddings.input_tensor, embeddings.output_tensor)
        )
        return UpstreamCall(
            kind=request.kind,
            upstream_model=self.upstream_model,
            prompt="",
            messages=(),
            params=request.params,
            prompt_estimate=estimate_request_tokens(request),
            inputs=request.inputs,
            tensors=tensors,
            # Shorter vectors: an `openai` upstream makes them, Triton's are cut here.
            dimensions=request.dimensions if self.config.backend is BackendKind.OPENAI else None,
        )
