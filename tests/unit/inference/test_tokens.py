"""The gateway's token estimate: four ASCII characters a token, and no under-count of
other scripts (it sizes first-token budgets, context checks and rate-limit reservations).
"""

from __future__ import annotations

import random

from gateway.inference.tokens import estimate_chat_tokens, estimate_tokens
from gateway.inference.types import ChatMessage


def cjk(characters: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(characters))


def test_ascii_text_is_four_characters_a_token() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") == 1
    assert estimate_tokens("word " * 800) == 1000
    assert estimate_tokens("x" * 30_000) == 7500


def test_a_30_kb_cjk_prompt_is_at_least_its_character_count() -> None:
    text = cjk(10_000)
    assert len(text.encode()) == 30_000
    # Characters / 4 made it 2,500 tokens; tokenizers give about one a character.
    assert estimate_tokens(text) >= 10_000


def test_emoji_and_other_scripts_are_not_under_counted() -> None:
    assert estimate_tokens("😀" * 1000) >= 1000
    assert estimate_tokens("はじめまして、よろしくお願いします" * 100) >= 1700
    assert estimate_tokens("Привет, как дела? " * 100) >= 0.5 * 1800  # 4+ chars a token
    assert estimate_tokens("안녕하세요" * 200) >= 1000


def test_a_few_non_ascii_characters_barely_change_an_english_estimate() -> None:
    english = "The quick brown fox jumps over the lazy dog. " * 200
    quoted = english + "“quoted” → café"
    assert estimate_tokens(english) <= estimate_tokens(quoted) <= estimate_tokens(english) + 10


def test_the_estimate_stays_under_one_token_a_utf8_byte() -> None:
    for text in (cjk(1000), "😀" * 1000, "é" * 1000, "ab€" * 1000):
        assert estimate_tokens(text) <= len(text.encode())


def test_a_lone_surrogate_is_counted_not_an_error() -> None:
    assert estimate_tokens("\ud800abc") >= 1


def test_chat_messages_in_cjk_are_counted_by_the_same_rule() -> None:
    text = cjk(2000)
    tokens = estimate_chat_tokens([ChatMessage("user", text)])
    assert tokens >= 2000 + 4 + 3
