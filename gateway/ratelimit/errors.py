"""Why the limiter could not decide: its own errors, which the API layer maps to HTTP."""

from __future__ import annotations


class UnknownTenant(Exception):
    """The tenant is not (or no longer: a reload removed it) in the tenants file."""

    def __init__(self, tenant: str) -> None:
        super().__init__(f"unknown tenant {tenant!r}")
        self.tenant = tenant


class LimiterUnavailable(Exception):
    """Redis cannot be reached and the failure mode is `closed`: nothing is admitted.

    `retry_after_s` is how long a client should wait before trying again.
    """

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("rate limits cannot be checked: Redis is unreachable")
        self.retry_after_s = retry_after_s
