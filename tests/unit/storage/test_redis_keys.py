"""Redis Cluster hash tags: one per tenant, distinct for distinct tenants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.storage.redis_keys import hash_tag


@given(a=st.text(min_size=1, max_size=8), b=st.text(min_size=1, max_size=8))
def test_distinct_tenants_get_distinct_tags(a: str, b: str) -> None:
    assert (hash_tag(a) == hash_tag(b)) == (a == b)
