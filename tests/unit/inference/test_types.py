"""The shared types' arithmetic: what a stream's pieces add up to."""

from __future__ import annotations

from gateway.inference.types import Delta, Usage, UsageMeter


def test_a_meters_running_total_is_its_usages_total() -> None:
    # `total` is what a stream is charged by piece by piece; `usage`, what it is settled
    # and answered with: they must agree at every piece.
    meter = UsageMeter()
    assert meter.total(12) == meter.usage(12).total_tokens == 12  # nothing yet: the estimate
    meter.add(Delta(text="Hi"))  # no count from upstream: a piece is a token
    assert meter.total(12) == meter.usage(12).total_tokens == 13
    meter.add(Delta(text="!", input_tokens=9, output_tokens=2))  # the upstream's prompt count
    assert meter.total(12) == meter.usage(12).total_tokens == 9 + 3
    meter.add(Delta(text="", usage=Usage(10, 4)))  # exact totals at the end win
    assert meter.total(12) == meter.usage(12).total_tokens == 14
