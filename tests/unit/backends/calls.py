"""An upstream call to send in backend tests."""

from __future__ import annotations

from gateway.inference.types import RequestKind, SamplingParams, UpstreamCall


def upstream_call(kind: RequestKind) -> UpstreamCall:
    return UpstreamCall(kind, "m", "hi", (), SamplingParams(max_tokens=4), 1)
