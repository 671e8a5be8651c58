"""Responses for tenants over their request rate or token quota."""

from __future__ import annotations

import math
from typing import Any


def rate_limited(tenant: str, retry_after_s: float) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(429, error body, headers) with a whole-second Retry-After of at least 1."""
    seconds = max(1, math.ceil(retry_after_s))
    body = {
        "error": {
            "message": f"Rate limit reached for tenant {tenant}. Retry in {seconds}s.",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    return 429, body, {"Retry-After": str(seconds)}


def quota_exhausted(tenant: str) -> tuple[int, dict[str, Any]]:
    return 429, {
        "error": {
            "message": f"Tenant {tenant} has used its monthly token quota.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
