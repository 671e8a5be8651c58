"""A request's session key: what keeps a conversation's requests on one replica, whose
prefix cache holds its earlier turns (`gateway.upstream.affinity`).

The first of: the model's session header (`routing.session_header`), the body's
`prompt_cache_key` (OpenAI's name for it; Codex CLI sends its conversation id), `user`
(Anthropic's `metadata.user_id`), and for the Responses API the conversation that
`previous_response_id` continues.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.api.errors import bad_request
from gateway.config import Routing
from gateway.inference.types import InferenceRequest

# Longer keys are cut: only their hash is used, and a client's key needs no more.
MAX_SESSION_KEY = 256


def with_session(
    inference: InferenceRequest,
    headers: Mapping[str, str],
    data: Mapping[str, Any],
    routing: Routing,
) -> InferenceRequest:
    """`inference` with its session key; a 400 when `prompt_cache_key` is not a string."""
    cache_key = data.get("prompt_cache_key")
    if cache_key is not None and not isinstance(cache_key, str):
        raise bad_request("`prompt_cache_key` must be a string.", "prompt_cache_key")
    header = headers.get(routing.session_header) if routing.session_header else None
    session = header or cache_key or inference.user or inference.session
    if session is not None:
        session = session[:MAX_SESSION_KEY]
    if session == inference.session:
        return inference
    return dataclasses.replace(inference, session=session)
