"""A model's `max_tokens_policy`: what a request above its `max_tokens_limit` gets."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.schema import ModelConfig

TRITON = {"backend": "triton_http", "replicas": [{"url": "http://127.0.0.1:8000"}]}


def test_clamp_is_the_default() -> None:
    assert ModelConfig.model_validate(TRITON).max_tokens_policy == "clamp"
    refusing = ModelConfig.model_validate({**TRITON, "max_tokens_policy": "refuse"})
    assert refusing.max_tokens_policy == "refuse"


@pytest.mark.parametrize("value", ["truncate", "CLAMP", "", None, True, 1, ["clamp"]])
def test_another_policy_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        ModelConfig.model_validate({**TRITON, "max_tokens_policy": value})
    assert caught.value.errors()[0]["loc"] == ("max_tokens_policy",)
