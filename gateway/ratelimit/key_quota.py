"""What one managed key adds to its tenant's limits (`gateway keys`): its own budgets and
its own, lower, request and token rates. The limiter takes from these buckets on the
same call as from the tenant's, so a key can only narrow what its tenant may do."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Budget


@dataclass(frozen=True, slots=True)
class KeyQuota:
    """A managed key's own caps, beside its tenant's. Made once per key record (the
    authenticator keeps it with the key's identity), compared by value when the key is
    changed while in use."""

    key_id: str
    budgets: tuple[Budget, ...] = ()
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def empty(self) -> bool:
        """Nothing of its own: the key is limited by its tenant's limits alone."""
        return (
            not self.budgets and self.requests_per_minute is None and self.tokens_per_minute is None
        )
