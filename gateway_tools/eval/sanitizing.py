"""Task content bound for an endpoint outside the cluster: the gateway's sanitization.

`gateway eval run --external` says the endpoint is outside the cluster (a vendor's API,
not this gateway). Then the messages of every task go through the detectors outbound
traffic goes through in the gateway (`gateway.privacy`: secrets, personal data and the
configured internal host names), under one of the gateway's policies: `mask` (typed
placeholders, the same value the same placeholder across a request's messages), `block`
(the task is not sent: its attempts fail naming what was found) or `off`. Through this
gateway, the gateway applies the tenant's own policy for the model, and the run records
that instead. The policy in force goes into the manifest and the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config.schema import OutboundPolicy
from gateway.privacy.patterns import PERSONAL, SECRETS, host_detector
from gateway.privacy.scanner import Masker, Scanner


class Blocked(Exception):
    """The task holds data the `block` policy keeps in the cluster."""

    def __init__(self, categories: Sequence[str]) -> None:
        super().__init__(", ".join(sorted(set(categories))))
        self.categories = sorted(set(categories))


@dataclass(frozen=True, slots=True)
class Sanitizer:
    """Applies one policy to the messages a run sends."""

    policy: OutboundPolicy
    internal_domains: tuple[str, ...] = ()

    def describe(self) -> dict[str, object]:
        """The policy as the manifest and the report state it."""
        return {"applied_by": "gateway eval", "policy": str(self.policy),
                "internal_domains": list(self.internal_domains)}  # fmt: skip

    def apply(self, messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[str]]:
        """The messages as they may leave, and the categories found (for the record)."""
        if self.policy is OutboundPolicy.OFF:
            return messages, []
        detectors = [*SECRETS, *PERSONAL]
        hosts = host_detector(self.internal_domains)
        if hosts is not None:
            detectors.append(hosts)
        scanner, masker = Scanner(detectors), Masker()
        found: list[str] = []
        out = []
        for message in messages:
            findings = scanner.find_deep(message["content"])
            found.extend(f.category for f in findings)
            content = masker.mask(message["content"], findings) if findings else message["content"]
            out.append({**message, "content": content})
        if found and self.policy is OutboundPolicy.BLOCK:
            raise Blocked(found)
        return out, sorted(set(found))


THROUGH_GATEWAY = {
    "applied_by": "the gateway",
    "policy": "the tenant's outbound policy for each model (gateway.yaml, tenants.yaml); "
    "models inside the cluster receive the task as it is",
}
