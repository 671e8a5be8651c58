"""A configured model, ready to serve: its backend, replicas and prompt template."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import Backend
from gateway.backends.prompt import PromptTemplate
from gateway.config import ModelConfig
from gateway.inference import InferenceRequest, RequestKind, UpstreamCall
from gateway.scheduler.routing import ReplicaPool


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    config: ModelConfig
    backend: Backend
    pool: ReplicaPool
    template: PromptTemplate

    @property
    def upstream_model(self) -> str:
        return self.config.upstream_model or self.name

    def upstream_call(self, request: InferenceRequest) -> UpstreamCall:
        """The request as this model's backend receives it."""
        if request.kind is RequestKind.CHAT:
            prompt = self.template.render(request.messages)
        else:
            prompt = request.prompt
        return UpstreamCall(
            kind=request.kind,
            upstream_model=self.upstream_model,
            prompt=prompt,
            messages=request.messages,
            params=request.params,
        )
