"""The OpenAI-compatible backend: where requests go."""

from __future__ import annotations

import pytest

from gateway.backends.openai_compatible import _endpoint
from gateway.inference.types import RequestKind
from tests.unit.backends.calls import upstream_call


@pytest.mark.parametrize(
    "url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"]
)
def test_openai_upstream_url_may_end_in_v1_or_not(url: str) -> None:
    assert _endpoint(url, upstream_call(RequestKind.CHAT)) == "http://h:8000/v1/chat/completions"
    assert _endpoint(url, upstream_call(RequestKind.COMPLETION)) == "http://h:8000/v1/completions"
