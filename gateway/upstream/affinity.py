"""Where a request's KV cache most likely is: its ring key (`gateway.upstream.ring`).

A request with a session key is placed by that key, so a conversation stays on one
replica even when many conversations share a long system prompt. Without one, by its
prompt's leading full KV blocks (`routing.prefix_blocks` of `routing.block_tokens`
tokens, 4 bytes a token), so prompts that start alike meet the replica that computed that
start. A prompt shorter than one block has no key: no cache can hold any of it, and it
goes to the least-loaded replica.
"""

from __future__ import annotations

from gateway.config import Routing
from gateway.inference.tokens import CHARS_PER_TOKEN
from gateway.inference.types import ChatMessage, UpstreamCall
from gateway.upstream.ring import position


def routing_key(call: UpstreamCall, routing: Routing) -> int | None:
    """The ring position that places `call`, or None when it has neither a session nor a
    full block of prompt."""
    if call.session:
        return position(b"session\x00" + call.session.encode())
    block = CHARS_PER_TOKEN * routing.block_tokens
    limit = block * routing.prefix_blocks
    # Only the head is read: a 32 KB prompt costs what a 1 KB one does.
    text = call.prompt[:limit] if call.prompt else _messages_head(call.messages, limit)
    head = text.encode()[:limit]
    full = len(head) - len(head) % block
    if not full:
        return None
    return position(b"prefix\x00" + head[:full])


def _messages_head(messages: tuple[ChatMessage, ...], limit: int) -> str:
    """The start of the messages as a server that renders them sees it (roles, content),
    for backends that take messages, not a prompt."""
    parts: list[str] = []
    size = 0
    for message in messages:
        parts.append(f"{message.role}\n{message.content}\n")
        size += len(parts[-1])
        if size >= limit:
            break
    return "".join(parts)[:limit]
