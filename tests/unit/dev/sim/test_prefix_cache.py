"""The simulated LLMs' prefix cache: chained block hashes in a bounded LRU."""

from __future__ import annotations

from gateway_tools.dev.sim.model_template import PrefixCache

BLOCK = 64  # 16 tokens of 4 bytes


def test_a_repeated_prompt_finds_its_full_blocks_cached() -> None:
    cache = PrefixCache(capacity_blocks=100)
    prompt = b"s" * (3 * BLOCK + 10)  # three full blocks and a partial one
    assert cache.lookup_and_store(prompt) == 0
    assert cache.lookup_and_store(prompt) == 3 * BLOCK


def test_a_longer_turn_reuses_the_earlier_turns_prefix() -> None:
    cache = PrefixCache(capacity_blocks=100)
    first = bytes(range(256)) * 2  # 8 blocks
    cache.lookup_and_store(first)
    assert cache.lookup_and_store(first + b"and the next turn" * 10) == 8 * BLOCK


def test_blocks_are_the_same_only_after_the_same_prefix() -> None:
    cache = PrefixCache(capacity_blocks=100)
    common = b"c" * BLOCK
    cache.lookup_and_store(b"a" * BLOCK + common)
    # The same second block after another first block is another block.
    assert cache.lookup_and_store(b"b" * BLOCK + common) == 0


def test_the_least_recently_used_blocks_go_first_when_full() -> None:
    cache = PrefixCache(capacity_blocks=4)
    one, two = b"1" * (2 * BLOCK), b"2" * (2 * BLOCK)
    cache.lookup_and_store(one)
    cache.lookup_and_store(two)
    assert cache.usage == 1.0
    assert cache.lookup_and_store(one) == 2 * BLOCK  # used again: now the most recent
    cache.lookup_and_store(b"3" * (2 * BLOCK))  # evicts `two`, the least recent
    assert cache.lookup_and_store(two) == 0


def test_prompts_shorter_than_a_block_and_a_cache_of_nothing() -> None:
    assert PrefixCache(capacity_blocks=10).lookup_and_store(b"short") == 0
    off = PrefixCache(capacity_blocks=0)
    off.lookup_and_store(b"x" * BLOCK)
    assert off.lookup_and_store(b"x" * BLOCK) == 0
