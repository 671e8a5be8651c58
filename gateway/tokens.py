"""Token counts when the upstream does not report them."""

from __future__ import annotations

# About four characters per token for English text with BPE tokenizers; used only to
# estimate before the upstream reports exact counts.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A rough token count of `text` (at least 1 for non-empty text)."""
    return -(-len(text) // CHARS_PER_TOKEN)
