"""Outbound sanitization: sensitive data in a request stays in the cluster.

A model marked `external` runs outside the cluster. Before a request is sent to one, its
text (every message's content and tool-call arguments, or the prompt) is scanned for
secrets, personal data and internal host names (`gateway.privacy`), and the policy of
the tenant for that model (`mask`, `block` or `off`; the tenant's `outbound` section,
else the model's own) decides:

- `mask`: each finding is replaced by a typed placeholder, the same value by the same
  placeholder in every message of the request;
- `block`: the request is refused with a 400 naming the categories found (never the
  values); a blocked fallback model is left out of the chain instead;
- `off`: the request goes as it is.

Each finding is counted by model, category and policy, and one audit log line per
request and external model says what was found, without the values.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gateway.config import Config, ModelConfig, Tenant
from gateway.config.schema import OutboundPolicy
from gateway.inference.types import InferenceRequest
from gateway.observability import metrics
from gateway.privacy.patterns import PERSONAL, SECRETS, host_detector
from gateway.privacy.scanner import Finding, Masker, Scanner

audit = logging.getLogger("gateway.audit")


class SensitiveDataBlocked(Exception):
    """The request holds data its policy keeps from an external model."""

    def __init__(self, model: str, categories: Sequence[str]) -> None:
        super().__init__(model, categories)
        self.model = model
        self.categories = sorted(set(categories))


@dataclass(frozen=True, slots=True)
class Outbound:
    """What leaves for each model of a fallback chain: `requests[i]` goes to `models[i]`."""

    models: list[str]
    requests: list[InferenceRequest]


def policy_for(tenant: Tenant, model: str, config: ModelConfig) -> OutboundPolicy:
    """The policy for `tenant`'s requests to `model`: the tenant's for that model, else
    the tenant's own, else the model's; `off` for a model inside the cluster."""
    if not config.external:
        return OutboundPolicy.OFF
    own = tenant.outbound
    return own.models.get(model) or own.policy or config.outbound


class OutboundGuard:
    """Prepares a request for each model of its chain under the tenant's policies."""

    def __init__(self, config: Config) -> None:
        detectors = [*SECRETS, *PERSONAL]
        hosts = host_detector(tuple(config.gateway.outbound.internal_domains))
        if hosts is not None:
            detectors.append(hosts)
        self._scanner = Scanner(detectors)
        self._models = config.gateway.models
        self._any_external = any(model.external for model in self._models.values())

    def prepare(
        self, tenant: str, settings: Tenant, chain: Sequence[str], request: InferenceRequest,
        request_id: str,
    ) -> Outbound | None:  # fmt: skip
        """The request for each model of `chain` that it may go to, or None when every
        model is inside the cluster (or `off`): then the request goes as it is.

        Raises SensitiveDataBlocked when the first model's policy blocks what was found.
        """
        if not self._any_external:
            return None  # the usual case, and the request path's: nothing leaves
        policies = [policy_for(settings, name, self._models[name]) for name in chain]
        if all(policy is OutboundPolicy.OFF for policy in policies):
            return None
        findings = _scan(request, self._scanner.find)
        found = Counter(f.category for texts in findings.values() for f in texts)
        masked: InferenceRequest | None = None
        models, requests = [], []
        for index, (name, policy) in enumerate(zip(chain, policies, strict=True)):
            if policy is not OutboundPolicy.OFF and found:
                _report(request_id, tenant, name, policy, found)
            if policy is OutboundPolicy.BLOCK and found:
                if index == 0:
                    raise SensitiveDataBlocked(name, list(found))
                continue  # not sent there: the chain goes on without it
            if policy is OutboundPolicy.MASK and found:
                if masked is None:
                    masked = _rewrite(request, findings, Masker())
                requests.append(masked)
            else:
                requests.append(request)
            models.append(name)
        return Outbound(models, requests)


# Findings of every text of a request, by the text's place in it: ("prompt",) for a
# completion's prompt, ("input", i) for an embedding request's text i, (message index,)
# for a message's content, (message index, call index) for the arguments of a tool call.
# Roles, names and call ids are not scanned: they are not the user's data, and a masked
# call id would no longer pair its result.
_Place = tuple[int | str, ...]
_PROMPT: _Place = ("prompt",)


def _input(index: int) -> _Place:
    return ("input", index)


def _texts(request: InferenceRequest) -> Iterator[tuple[_Place, str]]:
    if request.prompt:
        yield _PROMPT, request.prompt
    for index, text in enumerate(request.inputs):
        yield _input(index), text
    for index, message in enumerate(request.messages):
        if message.content:
            yield (index,), message.content
        for call_index, call in enumerate(message.tool_calls):
            yield (index, call_index), call.arguments


def _scan(
    request: InferenceRequest, find: Callable[[str], list[Finding]]
) -> dict[_Place, list[Finding]]:
    found = {place: find(text) for place, text in _texts(request)}
    return {place: findings for place, findings in found.items() if findings}


def _rewrite(
    request: InferenceRequest, findings: dict[_Place, list[Finding]], masker: Masker
) -> InferenceRequest:
    """`request` with every finding masked, in the order the texts come."""
    prompt = request.prompt
    if _PROMPT in findings:
        prompt = masker.mask(prompt, findings[_PROMPT])
    inputs = tuple(
        masker.mask(text, findings[at]) if (at := _input(index)) in findings else text
        for index, text in enumerate(request.inputs)
    )
    messages = list(request.messages)
    for index, message in enumerate(messages):
        content = message.content
        if (index,) in findings:
            content = masker.mask(content, findings[(index,)])
        calls = tuple(
            dataclasses.replace(call, arguments=masker.mask(call.arguments, findings[place]))
            if (place := (index, call_index)) in findings
            else call
            for call_index, call in enumerate(message.tool_calls)
        )
        messages[index] = dataclasses.replace(message, content=content, tool_calls=calls)
    return dataclasses.replace(request, prompt=prompt, messages=tuple(messages), inputs=inputs)


def _report(
    request_id: str, tenant: str, model: str, policy: OutboundPolicy, found: Counter[str]
) -> None:
    for category, count in found.items():
        metrics.labels(metrics.OUTBOUND_FINDINGS, model, category, policy.value).inc(count)
    audit.info(
        "outbound data %s for an external model",
        "masked" if policy is OutboundPolicy.MASK else "blocked",
        extra={
            "fields": {
                "request_id": request_id,
                "tenant": tenant,
                "model": model,
                "policy": policy.value,
                # Not {category: count}: a category such as `password` would read as a
                # secret field name to the log redaction, which hides its value.
                "findings": [{"category": c, "count": n} for c, n in sorted(found.items())],
            }
        },
    )
