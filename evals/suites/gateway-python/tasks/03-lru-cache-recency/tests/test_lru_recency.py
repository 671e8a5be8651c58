from promptcache.lru import LRUCache


def test_get_protects_a_key_from_eviction() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("system", 1)
    cache.put("a", 2)
    assert cache.get("system") == 1
    cache.put("b", 3)
    assert "system" in cache
    assert "a" not in cache
    assert cache.get("b") == 3


def test_put_on_existing_key_counts_as_use() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("x", 1)
    cache.put("y", 2)
    cache.put("x", 10)
    cache.put("z", 3)
    assert cache.peek("x") == 10
    assert "y" not in cache
    assert len(cache) == 2


def test_keys_are_ordered_by_recency() -> None:
    cache: LRUCache[str, int] = LRUCache(3)
    for i, key in enumerate(["a", "b", "c"]):
        cache.put(key, i)
    cache.get("a")
    cache.put("b", 5)
    assert cache.keys() == ["c", "a", "b"]


def test_peek_and_contains_are_not_uses() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert (cache.hits, cache.misses) == (0, 0)


def test_hit_and_miss_counters() -> None:
    cache: LRUCache[str, int] = LRUCache(1)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    cache.put("b", 2)
    assert cache.get("a") is None
    assert (cache.hits, cache.misses) == (1, 2)


def test_hot_key_survives_a_stream_of_new_keys() -> None:
    cache: LRUCache[str, int] = LRUCache(3)
    cache.put("system", 0)
    for i in range(20):
        assert cache.get("system") == 0
        cache.put(f"user-{i}", i)
    assert "system" in cache
    assert len(cache) == 3
