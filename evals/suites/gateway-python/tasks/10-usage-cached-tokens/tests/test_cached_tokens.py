import pytest

from usage.model import Usage
from usage.parse import usage_from_upstream
from usage.render import usage_to_openai


def test_usage_field_default_and_total() -> None:
    assert Usage(10, 5).cached_tokens == 0
    usage = Usage(prompt_tokens=200, completion_tokens=20, cached_tokens=128)
    assert usage.cached_tokens == 128
    assert usage.total_tokens == 220


@pytest.mark.parametrize("cached", [-1, 201, True, 1.5])
def test_invalid_cached_tokens(cached: object) -> None:
    with pytest.raises(ValueError):
        Usage(prompt_tokens=200, completion_tokens=1, cached_tokens=cached)  # type: ignore[arg-type]


def test_addition_sums_cached_tokens() -> None:
    total = Usage(100, 10, 64) + Usage(50, 5, 32) + Usage(7, 1)
    assert total == Usage(prompt_tokens=157, completion_tokens=16, cached_tokens=96)


def test_parse_cached_tokens() -> None:
    body = {
        "id": "chatcmpl-1",
        "usage": {
            "prompt_tokens": 300,
            "completion_tokens": 12,
            "total_tokens": 312,
            "prompt_tokens_details": {"cached_tokens": 256, "audio_tokens": 0},
        },
    }
    assert usage_from_upstream(body) == Usage(300, 12, 256)


def test_parse_without_details() -> None:
    plain = {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    assert usage_from_upstream(plain) == Usage(3, 4, 0)
    empty = {"usage": {"prompt_tokens": 3, "completion_tokens": 4, "prompt_tokens_details": {}}}
    assert usage_from_upstream(empty) == Usage(3, 4, 0)
    null = {
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": None},
        }
    }
    assert usage_from_upstream(null) == Usage(3, 4, 0)
    with pytest.raises(ValueError):
        usage_from_upstream({"usage": {"prompt_tokens": 3}})


def test_render_openai_shape() -> None:
    rendered = usage_to_openai(Usage(300, 12, 256))
    assert rendered == {
        "prompt_tokens": 300,
        "completion_tokens": 12,
        "total_tokens": 312,
        "prompt_tokens_details": {"cached_tokens": 256},
    }
    assert list(rendered) == [
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
    ]
    assert usage_to_openai(Usage(1, 2))["prompt_tokens_details"] == {"cached_tokens": 0}


def test_round_trip() -> None:
    usage = Usage(40, 2, 40)
    assert usage_from_upstream({"usage": usage_to_openai(usage)}) == usage
