"""loadtest/cache_workload.py: the cache-routing benchmark's requests and arrivals."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from loadtest.cache_workload import (
    WorkloadConfig,
    WorkloadRequest,
    arrival_times,
    request_stream,
    schedule,
    system_prompts,
    words,
)

DEFAULT = WorkloadConfig()
USER, ASSISTANT = DEFAULT.user_bytes, DEFAULT.assistant_bytes


def first(count: int, seed: int = 7, config: WorkloadConfig = DEFAULT) -> list[WorkloadRequest]:
    return list(itertools.islice(request_stream(seed, config), count))


def test_same_seed_same_requests_other_seed_others() -> None:
    assert first(300) == first(300)
    assert schedule(7, 5.0, 30.0) == schedule(7, 5.0, 30.0)
    assert first(50, seed=8) != first(50)


def test_rate_only_rescales_times() -> None:
    slow, fast = schedule(3, 2.0, 100.0), schedule(3, 4.0, 50.0)
    assert len(slow) == len(fast) > 100
    for a, b in zip(slow, fast, strict=True):
        assert a.request == b.request
        assert a.at == pytest.approx(2 * b.at)
    # A longer run at the same rate starts with the same requests at the same times.
    assert schedule(3, 2.0, 200.0)[: len(slow)] == slow


def test_arrivals_are_poisson_like() -> None:
    rate = 8.0
    times = arrival_times(11, rate, 2500.0)
    gaps = [b - a for a, b in itertools.pairwise([0.0, *times])]
    assert all(g > 0 for g in gaps) and times[-1] < 2500.0
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # Exponential gaps: the standard deviation equals the mean; P(gap > mean) = 1/e.
    assert statistics.pstdev(gaps) == pytest.approx(1 / rate, rel=0.05)
    assert sum(g > 1 / rate for g in gaps) / len(gaps) == pytest.approx(0.368, abs=0.02)
    with pytest.raises(ValueError):
        arrival_times(1, 0.0, 10.0)


def test_later_turns_extend_earlier_ones() -> None:
    requests = first(2000)
    by_conversation: dict[str, list[WorkloadRequest]] = {}
    for request in requests:
        if request.conversation is not None:
            by_conversation.setdefault(request.conversation, []).append(request)
    finished = 0
    config = DEFAULT
    for turns in by_conversation.values():
        assert [t.turn for t in turns] == list(range(1, len(turns) + 1))
        assert len({t.tenant for t in turns}) == 1
        for earlier, later in itertools.pairwise(turns):
            # Turn k+1 = turn k's messages, then the assistant's answer and a new question.
            assert later.messages[: len(earlier.messages)] == earlier.messages
            added = later.messages[len(earlier.messages) :]
            assert [m.role for m in added] == ["assistant", "user"]
        for turn in turns:
            assert [m.role for m in turn.messages] == ["system"] + ["user", "assistant"] * (
                turn.turn - 1
            ) + ["user"]
            user = [m for m in turn.messages if m.role == "user"]
            assistant = [m for m in turn.messages if m.role == "assistant"]
            assert all(USER[0] <= len(m.content) <= USER[1] for m in user)
            assert all(ASSISTANT[0] <= len(m.content) <= ASSISTANT[1] for m in assistant)
        assert len(turns) <= config.turns[1]
        finished += len(turns) >= config.turns[0]
    assert len(by_conversation) > config.active and finished > config.active


def test_one_offs_share_no_system_prompt() -> None:
    requests = first(2000)
    one_offs = [r for r in requests if r.one_off]
    assert 0.17 < len(one_offs) / len(requests) < 0.23
    systems = set(system_prompts(7).values())
    for request in one_offs:
        assert [m.role for m in request.messages] == ["user"]
        assert 2048 <= request.prompt_bytes <= 6144
        assert not any(request.messages[0].content.startswith(s[:64]) for s in systems)
    starts = {r.messages[0].content[:64] for r in one_offs}
    assert len(starts) == len(one_offs)


def test_tenants_have_their_own_system_prompts() -> None:
    prompts = system_prompts(7)
    assert len(prompts) == 6
    assert len({p[:64] for p in prompts.values()}) == 6
    assert all(4096 <= len(p) <= 4096 + 40 for p in prompts.values())
    for request in first(500):
        if not request.one_off:
            assert request.messages[0].content == prompts[request.tenant]
    tenants = {r.tenant for r in first(500) if not r.one_off}
    assert tenants == set(prompts)


def test_session_key_on_conversation_requests_only() -> None:
    for request in first(1000):
        if request.turn:
            assert request.conversation is not None
            assert request.conversation.startswith("conv-7-")
        else:
            assert request.conversation is None
            assert request.one_off


def test_words_are_ascii_and_exactly_sized() -> None:

    for size in (1, 64, 777, 4096):
        text = words(random.Random(size), size)
        assert len(text) == len(text.encode()) == size


def test_config_changes_the_mix() -> None:
    config = WorkloadConfig(tenants=2, one_off_share=0.0, active=3)
    requests = first(200, config=config)
    assert not any(r.one_off for r in requests)
    assert {r.tenant for r in requests} == {"tenant0", "tenant1"}
