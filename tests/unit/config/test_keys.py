"""API keys: the stored form of a key is its SHA-256 digest (what `gateway hash-key` prints)."""

from __future__ import annotations

from gateway.config import digest, hash_key
from tests.unit.config.sample_keys import ACME_KEY, BETA_KEY


def test_hash_key_output_is_the_stored_form() -> None:
    stored = hash_key(ACME_KEY)

    assert stored == "sha256:" + digest(ACME_KEY)
    assert len(digest(ACME_KEY)) == 64
    assert digest(ACME_KEY) != digest(BETA_KEY)
