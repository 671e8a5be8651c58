import pytest

from ratelimit.bucket import TokenBucket


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_idle_bucket_allows_only_burst_back_to_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=5.0, clock=clock)
    clock.advance(60.0)
    granted = sum(bucket.try_acquire() for _ in range(60))
    assert granted == 5


def test_cannot_take_more_than_burst_after_idle() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=4.0, clock=clock)
    clock.advance(100.0)
    assert not bucket.try_acquire(5.0)
    assert bucket.try_acquire(4.0)
    assert not bucket.try_acquire(1.0)


def test_available_matches_what_can_be_taken() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3.0, clock=clock)
    clock.advance(30.0)
    assert bucket.available() == pytest.approx(3.0)
    assert bucket.try_acquire(3.0)
    assert bucket.available() == pytest.approx(0.0)


def test_retry_after_counts_from_a_capped_bucket() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=2.0, clock=clock)
    clock.advance(50.0)
    assert bucket.try_acquire(2.0)
    assert bucket.retry_after(1.0) == pytest.approx(1.0)
    assert not bucket.try_acquire(1.0)
    clock.advance(1.0)
    assert bucket.try_acquire(1.0)


def test_partial_refill_still_works() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=10.0, clock=clock)
    assert bucket.try_acquire(10.0)
    clock.advance(1.5)
    assert bucket.available() == pytest.approx(3.0)
    assert bucket.try_acquire(3.0)
    assert not bucket.try_acquire(0.5)


def test_retry_after_rejects_more_than_burst() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0, clock=FakeClock())
    with pytest.raises(ValueError):
        bucket.retry_after(3.0)
