"""Outbound sanitization: sensitive data in a request stays in the cluster.

A model marked `external` runs outside the cluster. Before a request is sent to one,
every string it holds is scanned (`gateway.privacy.walker` finds them: message and
content text of every role, tool definitions and their schemas, tool calls and results,
stop sequences, ids, `user`, metadata), each read as written, normalized (escapes,
HTML references and percent-encoding decoded), with the separators inside numbers read
as spaces, with card numbers split across lines or table cells joined, and inside
encoded runs (`Scanner.find_deep`), for secrets, personal data and internal host names
(`gateway.privacy`); the policy of the tenant for that model (`mask`, `block` or `off`;
the tenant's `outbound` section, else the model's own) decides:

- `mask`: each finding is replaced by a typed placeholder, the same value (in any form)
  by the same placeholder everywhere in the request; what spelled it goes whole (every
  escape, reference, line break or table cell boundary inside it), an encoded run too;
- `block`: the request is refused with a 400 naming the categories found (never the
  values); a blocked fallback model is left out of the chain instead;
- `off`: the request goes as it is.

Each finding is counted by model, category and policy, and one audit log line per
request and external model says what was found, without the values. docs/outbound.md
has the details.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.config import Config, ModelConfig, Tenant
from gateway.config.schema import OutboundPolicy
from gateway.inference.types import InferenceRequest
from gateway.observability import metrics
from gateway.privacy.normalizer import normalize, warm_up
from gateway.privacy.patterns import PERSONAL, SECRETS, host_detector, is_secret_name
from gateway.privacy.scanner import Finding, Masker, Scanner
from gateway.privacy.walker import Walker

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
        if self._any_external or any(s.external for s in config.gateway.mcp.servers.values()):
            warm_up()  # the normalizer's tables, built now rather than on a request

    def scans(self, chain: Sequence[str]) -> bool:
        """Whether a request to `chain` may be scanned at all: a model of it is outside
        the cluster (a tenant's policy may still be `off`)."""
        return self._any_external and any(self._models[name].external for name in chain)

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
        findings = _Findings(request, self._scanner.find_deep)
        found = findings.counts
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
                    masked = findings.masked(request, Masker())
                requests.append(masked)
            else:
                requests.append(request)
            models.append(name)
        return Outbound(models, requests)

    def scan_json(
        self, request_id: str, tenant: str, server: str, policy: OutboundPolicy, value: Any
    ) -> Any:
        """`value` (an MCP tool call's arguments, or a result coming back) as it may go
        to or come from the external MCP server `server` under `policy`: every string of
        it scanned as a request's are, its keys too; masked, or `SensitiveDataBlocked`."""
        if policy is OutboundPolicy.OFF:
            return value
        findings = _Findings(value, self._scanner.find_deep)
        if not findings.counts:
            return value
        target = f"mcp:{server}"
        _report(request_id, tenant, target, policy, findings.counts)
        if policy is OutboundPolicy.BLOCK:
            raise SensitiveDataBlocked(target, list(findings.counts))
        return findings.masked(value, Masker())


# Not walked: the model name the client asked for (the upstream gets the configured
# `upstream_model`, and names are not the client's data) and the session key, which
# only places the request on a replica, hashed (`gateway.upstream.affinity`). Neither is
# sent: tests/unit/serving/test_outbound_fields.py fills every string field of a request
# with a secret and fails if any reaches a backend's body unmasked.
_WALKER = Walker({InferenceRequest: frozenset({"model", "session"})})


class _Findings:
    """The findings in every string of one request: message and content text of every
    role, tool definitions (names, descriptions, schemas), tool calls and results, stop
    sequences, ids, `user`, metadata, and whatever a request will hold."""

    def __init__(self, request: Any, find: Callable[[str], list[Finding]]) -> None:
        self.counts: Counter[str] = Counter()
        # By value: a schema repeats its `"type": "string"`, a conversation its roles.
        self._by_value: dict[tuple[str, bool], list[Finding]] = {}
        # Key names repeat too (`description`, `type`). Kept for this request only: a
        # key may be the client's data as well.
        self._secret_keys: dict[str, bool] = {}
        for text, key in _WALKER.strings(request):
            memo = (text, self._secret(key))
            found = self._by_value.get(memo)
            if found is None:
                found = self._by_value[memo] = _find(text, memo[1], find)
            for finding in found:
                self.counts.update(leaf.category for leaf in finding.leaves())

    def masked(self, request: Any, masker: Masker) -> Any:
        """`request` with every finding masked, in the order its strings come."""
        if not self.counts:
            return request

        def mask(text: str, key: str | None) -> str:
            found = self._by_value.get((text, self._secret(key)))
            return masker.mask(text, found) if found else text

        return _WALKER.rewrite(request, mask)

    def _secret(self, key: str | None) -> bool:
        """Whether a value under `key` is a secret by the key's name."""
        if key is None:
            return False
        secret = self._secret_keys.get(key)
        if secret is None:
            secret = self._secret_keys[key] = is_secret_name(normalize(key).text)
        return secret


def _find(text: str, secret: bool, find: Callable[[str], list[Finding]]) -> list[Finding]:
    if secret and text.strip():
        # `{"password": "hunter2"}`: the key says what the value is, whatever it looks like.
        return [Finding(0, len(text), "password", normalize(text).text)]
    return find(text)


def _report(
    request_id: str, tenant: str, model: str, policy: OutboundPolicy, found: Counter[str]
) -> None:
    for category, count in found.items():
        metrics.labels(metrics.OUTBOUND_FINDINGS, model, category, policy.value).inc(count)
    audit.info(
        "outbound data %s for an external %s",
        "masked" if policy is OutboundPolicy.MASK else "blocked",
        "MCP server" if model.startswith("mcp:") else "model",
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
