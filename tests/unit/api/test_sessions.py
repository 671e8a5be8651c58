"""The session key that keeps a conversation on one replica."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from gateway.api.errors import APIError
from gateway.api.sessions import MAX_SESSION_KEY, with_session
from gateway.config import Routing
from gateway.inference.types import InferenceRequest, RequestKind, SamplingParams

ROUTING = Routing(policy="cache_aware")


def request(user: str | None = None, session: str | None = None) -> InferenceRequest:
    return InferenceRequest(
        kind=RequestKind.CHAT,
        model="m",
        params=SamplingParams(max_tokens=8),
        user=user,
        session=session,
    )


def session_of(headers: dict[str, str], data: dict[str, object], **fields: str) -> str | None:
    return with_session(request(**fields), Headers(headers), data, ROUTING).session


def test_the_header_comes_first_then_prompt_cache_key_then_user_then_the_conversation() -> None:
    body = {"prompt_cache_key": "pck"}
    assert session_of({"x-session-id": "hdr"}, body, user="u", session="conv") == "hdr"
    assert session_of({}, body, user="u", session="conv") == "pck"
    assert session_of({}, {}, user="u", session="conv") == "u"
    assert session_of({}, {}, session="conv") == "conv"
    assert session_of({}, {}) is None


def test_the_header_is_the_one_the_model_names() -> None:
    routing = Routing(policy="cache_aware", session_header="x-codex-session")
    got = with_session(request(), Headers({"x-codex-session": "abc"}), {}, routing)
    assert got.session == "abc"
    off = Routing(policy="cache_aware", session_header=None)
    assert with_session(request(), Headers({"x-session-id": "abc"}), {}, off).session is None


def test_a_prompt_cache_key_that_is_not_a_string_is_a_400() -> None:
    with pytest.raises(APIError) as caught:
        session_of({}, {"prompt_cache_key": 7})
    assert caught.value.status == 400
    assert caught.value.param == "prompt_cache_key"


def test_a_very_long_key_is_cut() -> None:
    assert session_of({}, {"prompt_cache_key": "k" * 10_000}) == "k" * MAX_SESSION_KEY
