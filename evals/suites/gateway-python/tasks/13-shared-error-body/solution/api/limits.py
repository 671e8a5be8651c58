"""Responses for tenants over their request rate or token quota."""

from __future__ import annotations

import math
from typing import Any

from api.errors import error_body


def rate_limited(tenant: str, retry_after_s: float) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(429, error body, headers) with a whole-second Retry-After of at least 1."""
    seconds = max(1, math.ceil(retry_after_s))
    body = error_body(
        f"Rate limit reached for tenant {tenant}. Retry in {seconds}s.",
        "rate_limit_error",
        code="rate_limit_exceeded",
    )
    return 429, body, {"Retry-After": str(seconds)}


def quota_exhausted(tenant: str) -> tuple[int, dict[str, Any]]:
    return 429, error_body(
        f"Tenant {tenant} has used its monthly token quota.",
        "insufficient_quota",
        code="insufficient_quota",
    )
