import pytest

from metrics.percentile import latency_summary, percentile

ONE_TO_TEN = [float(i) for i in range(1, 11)]


def test_nearest_rank_on_one_to_ten() -> None:
    assert percentile(ONE_TO_TEN, 50) == 5.0
    assert percentile(ONE_TO_TEN, 90) == 9.0
    assert percentile(ONE_TO_TEN, 95) == 10.0
    assert percentile(ONE_TO_TEN, 10) == 1.0
    assert percentile(ONE_TO_TEN, 11) == 2.0


def test_p100_is_the_maximum_and_input_order_does_not_matter() -> None:
    samples = [7.5, 1.0, 42.0, 3.0]
    assert percentile(samples, 100) == 42.0
    assert percentile(samples, 25) == 1.0
    assert percentile(samples, 50) == 3.0
    assert samples == [7.5, 1.0, 42.0, 3.0]


def test_single_sample() -> None:
    for p in (0.1, 50, 99.9, 100):
        assert percentile([12.5], p) == 12.5


def test_small_p_is_the_minimum() -> None:
    assert percentile([float(i) for i in range(1, 101)], 0.5) == 1.0


@pytest.mark.parametrize("p", [0, -1, 100.1])
def test_out_of_range_and_empty(p: float) -> None:
    with pytest.raises(ValueError):
        percentile(ONE_TO_TEN, p)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_latency_summary() -> None:
    samples = [float(i) for i in range(1, 101)]
    summary = latency_summary(samples, (50, 99, 99.9, 100))
    assert summary == {
        "count": 100,
        "mean": pytest.approx(50.5),
        "p50": 50.0,
        "p99": 99.0,
        "p99.9": 100.0,
        "p100": 100.0,
    }
    assert latency_summary([3.0]) == {
        "count": 1,
        "mean": 3.0,
        "p50": 3.0,
        "p90": 3.0,
        "p99": 3.0,
        "p100": 3.0,
    }
    assert latency_summary([]) == {"count": 0}
