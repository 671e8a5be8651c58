"""A replica's first request, sent by the placement leader before the replica takes
traffic: the smallest request its model serves (one token, or one short text to embed),
so that what a model does on its first request (allocating, compiling, filling caches)
is not paid by a client's. Triton reports a model ready once loaded; this is one step
further: it answered.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.backends.base import UpstreamError
from gateway.inference.types import ChatMessage, InferenceRequest, RequestKind, SamplingParams
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.placement")

WARM_UP_TEXT = "warm-up"


def warm_up_request(route: ModelRoute) -> InferenceRequest:
    """The smallest request `route`'s model answers."""
    if route.config.capabilities.embeddings is not None:
        return InferenceRequest(
            RequestKind.EMBEDDING, route.name, SamplingParams(max_tokens=1), inputs=(WARM_UP_TEXT,)
        )
    return InferenceRequest(
        RequestKind.CHAT,
        route.name,
        SamplingParams(max_tokens=1),
        messages=(ChatMessage("user", WARM_UP_TEXT),),
    )


async def warm_up(route: ModelRoute, url: str, timeout_s: float) -> bool:
    """Send the warm-up request to the replica at `url`; whether it answered in time. A
    replica that does not is served all the same (its health checks and the outlier
    check take it out if it is broken), with a warning."""
    try:
        await asyncio.wait_for(
            route.backend.complete(url, route.upstream_call(warm_up_request(route))), timeout_s
        )
    except (UpstreamError, TimeoutError, OSError) as exc:
        log.warning(
            "warm-up of %s at %s failed (%s); serving it all the same", route.name, url, exc
        )
        return False
    return True
