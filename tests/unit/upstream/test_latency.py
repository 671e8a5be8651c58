"""The latency model the predicted wait uses: one tenant's request shape must not move
the prediction for everyone else's requests.

A simulated replica: 50 ms to the first token plus 0.3 ms a prompt token (prefill), then
20 ms an output token (decode). A 100,000-token prompt with 2 output tokens takes 30 s,
nearly all of it prefill.
"""

from __future__ import annotations

import random

import pytest

from gateway.upstream.latency import FASTEST_TOKEN_S, LatencyTracker

BASE_S, PREFILL_S, DECODE_S = 0.05, 0.0003, 0.02
HOSTILE_PROMPT, HOSTILE_OUTPUT = 100_000, 2


def first_token_s(prompt: int) -> float:
    return BASE_S + PREFILL_S * prompt


def total_s(prompt: int, output: int) -> float:
    return first_token_s(prompt) + DECODE_S * (output - 1)


def serve(latency: LatencyTracker, prompt: int, output: int, stream: bool) -> None:
    """What the dispatcher reports of one finished request."""
    ttft = first_token_s(prompt) if stream else None
    latency.observe(ttft, total_s(prompt, output), output, prompt)


def warmed(streamed_share: float, seed: int = 7) -> LatencyTracker:
    """A tracker after 200 ordinary requests (chat questions to agent turns)."""
    rng = random.Random(seed)
    latency = LatencyTracker()
    for _ in range(200):
        prompt = rng.choice([60, 100, 300, 1500, 6000])
        output = rng.choice([50, 100, 300])
        serve(latency, prompt, output, rng.random() < streamed_share)
    return latency


def chat_request_s(latency: LatencyTracker, stream: bool) -> float:
    """The predicted time of another tenant's chat request: 100 prompt tokens, 100 out."""
    return latency.expected_s(stream, 100, 100)


@pytest.mark.parametrize("streamed_share", [0.0, 0.5])
def test_prefill_heavy_whole_answers_leave_a_chat_requests_prediction(
    streamed_share: float,
) -> None:
    # One tenant sends 50 non-streamed requests of a 100,000-token prompt and max_tokens
    # 2; before, their 30 s of prefill over one output token became everyone's time per
    # token, and a chat request was predicted to take about 3,000 s (it takes 2.06 s).
    latency = warmed(streamed_share)
    before = chat_request_s(latency, stream=False)
    assert before == pytest.approx(total_s(100, 100), rel=0.1)
    for _ in range(50):
        serve(latency, HOSTILE_PROMPT, HOSTILE_OUTPUT, stream=False)
    assert chat_request_s(latency, stream=False) == pytest.approx(before, rel=0.05)
    assert chat_request_s(latency, stream=True) == pytest.approx(first_token_s(100), rel=0.2)


def test_long_prompt_streams_leave_a_chat_requests_first_token_prediction() -> None:
    # Streamed, the same requests used to make the usual first-token time 30 s for all.
    latency = warmed(streamed_share=1.0)
    before = chat_request_s(latency, stream=True)
    for _ in range(50):
        serve(latency, HOSTILE_PROMPT, HOSTILE_OUTPUT, stream=True)
    assert chat_request_s(latency, stream=True) == pytest.approx(before, rel=0.05)
    assert chat_request_s(latency, stream=False) == pytest.approx(total_s(100, 100), rel=0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_prompt_is_predicted_to_take_its_prefill(stream: bool) -> None:
    # The tenant's own requests are predicted as long as they are: a deadline shorter
    # than its prefill is known to be missed before anything is sent.
    latency = warmed(streamed_share=0.5)
    for _ in range(50):
        serve(latency, HOSTILE_PROMPT, HOSTILE_OUTPUT, stream=stream)
    expected = latency.expected_s(False, HOSTILE_OUTPUT, HOSTILE_PROMPT)
    assert expected == pytest.approx(total_s(HOSTILE_PROMPT, HOSTILE_OUTPUT), rel=0.05)


def test_the_prefill_rate_is_learned_from_whole_answers_alone() -> None:
    # No streams at all: nothing measures a first token, yet prompts of several sizes
    # separate prefill from decoding.
    latency = warmed(streamed_share=0.0)
    for prompt in (100, 1500, 6000):
        assert latency.expected_s(False, 100, prompt) == pytest.approx(
            total_s(prompt, 100), rel=0.1
        )


def test_a_model_turned_slow_for_everyone_is_still_learned() -> None:
    latency = warmed(streamed_share=0.0)
    before = chat_request_s(latency, stream=False)
    for _ in range(20):
        latency.observe(None, 3 * total_s(100, 100), 100, 100)
    assert chat_request_s(latency, stream=False) >= 2.5 * before


def test_cached_long_prompts_do_not_make_the_prediction_negative() -> None:
    # A long prompt served from the prefix cache answers fast: the prefill rate drops,
    # never below 0, and a chat request's prediction stays about what it was.
    latency = warmed(streamed_share=0.5)
    before = chat_request_s(latency, stream=False)
    for _ in range(50):
        latency.observe(None, total_s(100, 2), HOSTILE_OUTPUT, HOSTILE_PROMPT)
    assert latency.prefill_s >= 0.0
    assert latency.expected_s(False, 100, HOSTILE_PROMPT) > 0.0
    assert chat_request_s(latency, stream=False) == pytest.approx(before, rel=0.05)


def test_nothing_observed_predicts_nothing_then_the_first_request_exactly() -> None:
    latency = LatencyTracker()
    assert latency.expected_s(False, 100, 100) == 0.0
    serve(latency, 100, 100, stream=False)
    assert latency.expected_s(False, 100, 100) == pytest.approx(total_s(100, 100))
    streamed = LatencyTracker()
    serve(streamed, 2000, 50, stream=True)
    assert streamed.expected_s(True, 50, 2000) == pytest.approx(first_token_s(2000))
    assert streamed.expected_s(False, 50, 2000) == pytest.approx(total_s(2000, 50))


def test_the_first_whole_answer_teaches_its_time_per_token_in_full() -> None:
    # Only first-token times known (streams that timed out): the first whole answer is
    # predicted as it took, as the predicted wait needs it for the next request.
    latency = LatencyTracker()
    latency.observe(0.5, 0.5, 0, 40)
    latency.observe(None, 0.8, 20, 10)
    assert latency.expected_s(False, 20, 10) == pytest.approx(0.8)


def test_what_a_cut_request_can_have_made_is_bounded_by_its_time_and_max_tokens() -> None:
    """A request cut before its answer was seen is charged at most the tokens its time
    allows at the model's measured rate (rounded up), never past `max_tokens`; at 1,000
    tokens a second while no rate is known (issue 40: 50 ms were charged 1,000 tokens)."""
    tracker = LatencyTracker()
    assert tracker.most_generated(0.05, 1000) == 50
    assert tracker.most_generated(5.0, 1000) == 1000
    tracker.observe(0.1, 1.1, 101, 10)  # 10 ms a token after the first
    assert tracker.most_generated(0.05, 1000) == 5
    assert tracker.most_generated(0.051, 1000) == 6
    assert tracker.most_generated(60.0, 1000) == 1000
    assert tracker.most_generated(-1.0, 1000) == 0


def test_a_deadlines_lower_bound_is_no_rate_to_charge_at() -> None:
    # A fresh model whose first request was cut at 50 ms with max_tokens 1000: what the
    # cut teaches (1,000 tokens in 50 ms) is a bound for predictions, not a rate that
    # makes every later cut pay all of max_tokens.
    tracker = LatencyTracker()
    tracker.observe(None, 0.05, 1000, 14)
    assert tracker.per_token_s is not None and tracker.per_token_s < FASTEST_TOKEN_S
    assert tracker.most_generated(0.05, 1000) == 50
