import pytest

from settings.duration import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("1ms", 0.001),
        ("1s500ms", 1.5),
        ("2m15s250ms", 135.25),
        ("1h0m0s1ms", 3600.001),
    ],
)
def test_milliseconds_are_parsed(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1h", 3600.0), ("1m30s", 90.0), ("2.5s", 2.5), ("1.5h", 5400.0), ("  45s ", 45.0)],
)
def test_other_units_still_work(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "   ", "10", "5x", "ms", "1m 30s", "1s-5ms", "s1", "1msx"])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [0.0, 0.25, 1.5, 90.0, 3600.001, 7325.75])
def test_format_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_format_examples() -> None:
    assert format_duration(90) == "1m30s"
    assert format_duration(0.25) == "250ms"
    assert format_duration(0) == "0s"
