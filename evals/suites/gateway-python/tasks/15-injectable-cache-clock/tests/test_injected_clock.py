from types import SimpleNamespace

import pytest

from cache import ttl
from cache.ttl import TTLCache
from sessions.store import SessionStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def no_real_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> float:
        raise AssertionError("the real clock was read")

    monkeypatch.setattr(ttl, "time", SimpleNamespace(monotonic=boom))


def test_entry_expires_exactly_at_ttl(no_real_time: None) -> None:
    clock = FakeClock()
    cache: TTLCache[str, int] = TTLCache(10.0, clock=clock)
    cache.put("a", 1)
    clock.now += 9.75
    assert cache.get("a") == 1
    assert len(cache) == 1
    clock.now += 0.25
    assert cache.get("a") is None
    assert len(cache) == 0


def test_put_restarts_the_ttl(no_real_time: None) -> None:
    clock = FakeClock()
    cache: TTLCache[str, int] = TTLCache(5.0, clock=clock)
    cache.put("a", 1)
    clock.now += 4.0
    cache.put("a", 2)
    clock.now += 4.0
    assert cache.get("a") == 2
    clock.now += 1.0
    assert cache.get("a") is None


def test_eviction_prefers_expired_then_oldest(no_real_time: None) -> None:
    clock = FakeClock()
    cache: TTLCache[str, int] = TTLCache(10.0, max_entries=3, clock=clock)
    cache.put("old", 0)
    clock.now += 6.0
    cache.put("b", 1)
    cache.put("c", 2)
    clock.now += 5.0
    cache.put("d", 3)
    assert [cache.get(k) for k in ("old", "b", "c", "d")] == [None, 1, 2, 3]
    cache.put("e", 4)
    assert [cache.get(k) for k in ("b", "c", "d", "e")] == [None, 2, 3, 4]


def test_session_store_passes_its_clock(no_real_time: None) -> None:
    clock = FakeClock()
    store = SessionStore(60.0, clock=clock)
    session = store.create("acme")
    assert store.get(session.session_id, "acme") is session
    assert store.get(session.session_id, "globex") is None
    clock.now += 59.0
    session.turns.append("hello")
    store.save(session)
    clock.now += 59.0
    assert store.get(session.session_id, "acme") is session
    assert store.active_count() == 1
    clock.now += 1.0
    assert store.get(session.session_id, "acme") is None
    assert store.active_count() == 0


def test_clock_is_keyword_only_and_defaults_work() -> None:
    with pytest.raises(TypeError):
        TTLCache(1.0, 10, FakeClock())  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        SessionStore(1.0, FakeClock())  # type: ignore[call-arg]
    cache: TTLCache[str, int] = TTLCache(3600.0)
    cache.put("a", 1)
    assert cache.get("a") == 1
    store = SessionStore(3600.0)
    session = store.create("acme")
    assert store.get(session.session_id, "acme") is session


def test_validation_unchanged() -> None:
    with pytest.raises(ValueError):
        TTLCache(0.0, clock=FakeClock())
    with pytest.raises(ValueError):
        TTLCache(1.0, max_entries=0, clock=FakeClock())
