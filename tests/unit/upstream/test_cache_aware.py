"""Cache-aware replica choice: ring keys, the consistent-hash ring, bounded loads."""

from __future__ import annotations

import collections

import pytest

from gateway.config import Routing
from gateway.inference.types import ChatMessage, RequestKind, SamplingParams, UpstreamCall
from gateway.upstream.affinity import routing_key
from gateway.upstream.pool import ReplicaPool, Skip
from gateway.upstream.ring import HashRing, position

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
ROUTING = Routing(policy="cache_aware")
BLOCK = 64  # bytes: 16 tokens of 4 bytes
KEYS = [position(f"key {i}".encode()) for i in range(4000)]


def call(
    prompt: str = "", session: str | None = None, messages: tuple[ChatMessage, ...] = ()
) -> UpstreamCall:
    return UpstreamCall(
        kind=RequestKind.CHAT,
        upstream_model="m",
        prompt=prompt,
        messages=messages,
        params=SamplingParams(max_tokens=8),
        prompt_estimate=1,
        session=session,
    )


def owners(ring: HashRing) -> list[str]:
    return [ring.urls[ring.walk(key)[0]] for key in KEYS]


# -- keys --------------------------------------------------------------------------------


def test_a_prompt_shorter_than_one_block_has_no_key() -> None:
    assert routing_key(call("x" * (BLOCK - 1)), ROUTING) is None
    assert routing_key(call(""), ROUTING) is None
    assert routing_key(call("x" * BLOCK), ROUTING) is not None


def test_prompts_that_share_their_leading_blocks_share_a_key() -> None:
    head = "".join(f"system prompt line {i}\n" for i in range(100))  # > 16 blocks
    assert len(head) > 16 * BLOCK
    first = routing_key(call(head + "turn one"), ROUTING)
    later = routing_key(call(head + "turn one, answer, turn two" * 50), ROUTING)
    assert first == later
    assert routing_key(call("other " + head), ROUTING) != first


def test_only_full_blocks_count_so_a_partial_tail_does_not_change_the_key() -> None:
    prompt = "a" * (3 * BLOCK)
    assert routing_key(call(prompt), ROUTING) == routing_key(call(prompt + "b" * 10), ROUTING)
    assert routing_key(call(prompt), ROUTING) != routing_key(call(prompt + "b" * BLOCK), ROUTING)


def test_a_session_key_places_the_request_whatever_its_prompt() -> None:
    one = routing_key(call("a" * 2000, session="conversation-7"), ROUTING)
    two = routing_key(call("b" * 9000, session="conversation-7"), ROUTING)
    assert one == two
    assert one != routing_key(call("a" * 2000, session="conversation-8"), ROUTING)


def test_messages_place_a_request_to_a_backend_that_renders_them_itself() -> None:
    system = ChatMessage("system", "You are a careful assistant. " * 40)
    first = call(messages=(system, ChatMessage("user", "hello")))
    later = call(messages=(system, ChatMessage("user", "hello"), ChatMessage("assistant", "hi")))
    assert routing_key(first, ROUTING) == routing_key(later, ROUTING) is not None


# -- the ring ----------------------------------------------------------------------------


def test_every_gateway_builds_the_same_ring_whatever_the_order_of_its_replicas() -> None:
    assert owners(HashRing(URLS, 100)) == owners(HashRing(list(reversed(URLS)), 100))


def test_keys_spread_over_the_replicas() -> None:
    counts = collections.Counter(owners(HashRing(URLS, 100)))
    assert set(counts) == set(URLS)
    assert max(counts.values()) < 1.5 * len(KEYS) / len(URLS)


def test_a_removed_replica_moves_only_its_keys_to_their_next_owner() -> None:
    ring = HashRing(URLS, 100)
    before = owners(ring)
    after = owners(HashRing(URLS[:-1], 100))
    for key, old, new in zip(KEYS, before, after, strict=True):
        if old != URLS[-1]:
            assert new == old
        else:  # the next replica clockwise that is still there
            nexts = [ring.urls[i] for i in ring.walk(key)]
            assert new == nexts[1]


def test_an_added_replica_takes_only_its_share() -> None:
    before = owners(HashRing(URLS, 100))
    after = owners(HashRing([*URLS, "http://10.0.0.5:8000"], 100))
    moved = [new for old, new in zip(before, after, strict=True) if old != new]
    assert set(moved) == {"http://10.0.0.5:8000"}
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5


# -- choice with bounded loads -----------------------------------------------------------


def pool_of(urls: list[str] = URLS, load_factor: float = 1.25) -> ReplicaPool:
    return ReplicaPool(urls, load_factor=load_factor)


def test_the_owner_takes_its_keys_while_loads_are_even() -> None:
    pool = pool_of()
    ring = HashRing(URLS, 100)
    for key in KEYS[:50]:
        choice = pool.choose(key=key)
        assert choice.replica is not None
        assert choice.replica.url == ring.urls[ring.walk(key)[0]]
        assert choice.skipped is None


def test_a_hot_key_spreads_over_the_ring_within_the_bound() -> None:
    pool = pool_of()
    key = KEYS[0]
    owner = pool.choose(key=key).replica
    skips = collections.Counter[Skip | None]()
    for _ in range(40):  # none finishes: the load only grows
        choice = pool.choose(key=key)
        assert choice.replica is not None
        choice.replica.outstanding += 1
        skips[choice.skipped] += 1
        loads = [r.outstanding for r in pool.replicas]
        assert max(loads) <= -(-1.25 * sum(loads) // len(loads))
    assert all(r.outstanding > 0 for r in pool.replicas)  # the bound spread it over all
    assert owner is not None and owner.outstanding == max(r.outstanding for r in pool.replicas)
    assert skips[Skip.LOAD] > 0


def test_an_unhealthy_owner_passes_its_keys_to_the_next_on_the_ring() -> None:
    pool = pool_of()
    key = KEYS[1]
    owner = pool.choose(key=key).replica
    assert owner is not None
    owner.healthy = False
    choice = pool.choose(key=key)
    survivors = [u for u in URLS if u != owner.url]
    expected = HashRing(URLS, 100)
    order = [expected.urls[i] for i in expected.walk(key)]
    assert choice.replica is not None and choice.replica.url == order[1]
    assert choice.replica.url == owners_of(survivors, key)
    assert choice.skipped is Skip.UNAVAILABLE


def owners_of(urls: list[str], key: int) -> str:
    ring = HashRing(urls, 100)
    return ring.urls[ring.walk(key)[0]]


def test_a_retry_goes_to_the_next_on_the_ring_and_is_not_counted_as_a_skip() -> None:
    pool = pool_of()
    key = KEYS[2]
    first = pool.choose(key=key).replica
    assert first is not None
    retry = pool.choose(exclude=[first], key=key)
    assert retry.replica is not None and retry.replica is not first
    assert retry.skipped is None


def test_the_in_flight_cap_counts_as_load() -> None:
    pool = pool_of()
    key = KEYS[3]
    owner = pool.choose(key=key).replica
    assert owner is not None
    owner.outstanding = 2
    choice = pool.choose(max_in_flight=2, key=key)
    assert choice.replica is not owner and choice.skipped is Skip.LOAD


def test_without_a_key_the_least_loaded_replica_takes_the_request() -> None:
    pool = pool_of()
    for replica, load in zip(pool.replicas, [3, 1, 2, 4], strict=True):
        replica.outstanding = load
    assert pool.choose().replica is pool.replicas[1]


def test_a_new_placement_rebuilds_the_ring_and_keeps_the_replicas_state() -> None:
    pool = pool_of()
    kept = pool.replicas[0]
    kept.outstanding = 1
    placed = [*URLS[:2], "http://10.0.0.9:8000"]
    pool.set_urls(placed)
    assert pool.replicas[0] is kept and kept.outstanding == 1
    kept.outstanding = 0
    for key in KEYS[:30]:
        choice = pool.choose(key=key)
        assert choice.replica is not None and choice.replica.url == owners_of(placed, key)


@pytest.mark.parametrize("factor", [1.01, 1.25, 2.0])
def test_no_replica_goes_above_the_bound_under_a_random_load(factor: float) -> None:
    pool = pool_of(load_factor=factor)
    for key in KEYS[:200]:
        choice = pool.choose(key=key)
        assert choice.replica is not None
        choice.replica.outstanding += 1
        loads = [r.outstanding for r in pool.replicas]
        assert max(loads) <= -(-factor * sum(loads) // len(loads))
