"""The limiter's precomputed take.lua calls and its fast path for allowed requests: the
same KEYS and ARGV as `RedisBuckets.take` sends, the same headers as `_decide` makes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakeredis import FakeAsyncRedis
from hiredis import pack_command
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.encoders import Encoder

from gateway.config import RateLimitConfig, TenantsConfig
from gateway.ratelimit.buckets import LeaseSpec
from gateway.ratelimit.coalescer import PackedCall
from gateway.ratelimit.decisions import allowed_headers, decide
from gateway.ratelimit.limit_plan import encoded, plan_for
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.redis_store import RedisBuckets, adjust_call, take_result

KEY_HASH = "sha256:" + "0" * 64


def tenant(**limits: Any) -> Any:
    config = TenantsConfig.model_validate(
        {"tenants": {"t": {"api_keys": [KEY_HASH], "limits": limits}}}
    )
    return config.tenants["t"]


LIMITS = [
    {"requests_per_minute": 60},
    {"tokens_per_minute": 1000, "burst_tokens": 50},
    {"requests_per_minute": 7, "tokens_per_minute": 999, "max_concurrent": 3},
    {
        "requests_per_minute": 600,
        "tokens_per_minute": 100_000,
        "models": {"m": {"requests_per_minute": 60, "tokens_per_minute": 9000}},
    },
    {"max_concurrent": 2},
]


@pytest.mark.parametrize("limits", LIMITS)
@pytest.mark.parametrize("with_lease", [False, True])
async def test_a_plan_sends_what_the_store_would_build(
    limits: dict[str, Any], with_lease: bool
) -> None:
    plan = plan_for("p", "t", tenant(**limits), "m")
    sent: list[tuple[list[str], list[Any]]] = []
    store = RedisBuckets(FakeAsyncRedis())

    async def run(script: Any, keys: Any, args: Any) -> Any:
        sent.append((list(keys), list(args)))
        n = len(plan.buckets)
        return [1, "1.5"] + [1, "2", 0, 0] * n + ([1, 1] if with_lease else [])

    store._run = run  # type: ignore[method-assign]

    def take_reply(keys: Any, args: Any, packed: bytes | None = None) -> Any:
        return run(None, keys, args)

    store.take_reply = take_reply  # type: ignore[method-assign]
    config = TenantsConfig.model_validate({"tenants": {"t": {"api_keys": [KEY_HASH]}}})
    limiter = RateLimiter(store, None, config, RateLimitConfig(), "p")
    lease = LeaseSpec(plan.inflight_key, "member", 3, 30_000) if with_lease else None
    for reserve in (0, 25, 10**6):
        specs = [b.spec(cost) for b, cost in zip(plan.buckets, plan.costs(reserve), strict=True)]
        await store.take(specs, lease)
        await limiter._take_in_redis(plan, reserve, lease)
        keys, args = sent.pop()
        expected_keys, expected_args = sent.pop()
        assert wire(keys, args) == wire(expected_keys, expected_args)


def wire(keys: list[str], args: list[Any]) -> tuple[bytes, list[bytes]]:
    """What a call sends: the command as the coalescer packs it (hiredis), and its
    arguments as redis-py encodes them (a Redis Cluster's calls)."""
    encoder = Encoder("utf-8", "strict", False)  # type: ignore[no-untyped-call]
    packed = pack_command(("EVALSHA", "0" * 40, len(keys), *keys, *args))
    return packed, [encoder.encode(a) for a in (*keys, *args)]  # type: ignore[no-untyped-call]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_is_sent_as_the_bytes_it_is_encoded_to(value: float) -> None:
    assert wire([], list(encoded([value]))) == wire([], [value])


remaining = st.one_of(st.floats(-1e6, 1e9), st.integers(-1000, 10**9).map(float))


@given(
    limits=st.sampled_from(LIMITS[:4]),
    levels=st.lists(remaining, min_size=4, max_size=4),
    resets=st.lists(
        st.one_of(st.integers(-1, 1001), st.integers(-1, 10**8)), min_size=4, max_size=4
    ),
)
def test_allowed_headers_are_those_of_decide(
    limits: dict[str, Any], levels: list[float], resets: list[int]
) -> None:
    plan = plan_for("p", "t", tenant(**limits), "m")
    reply: list[Any] = [1, "1.5"]
    for level, reset in zip(levels, resets[: len(plan.buckets)], strict=False):
        reply += [1, repr(level), 0, reset]
    reply = reply[: 2 + 4 * len(plan.buckets)]
    decision = decide(plan, take_result(reply, len(plan.buckets), False))
    assert decision.allowed
    assert list(allowed_headers(plan, reply).items()) == list(decision.headers.items())


@pytest.mark.parametrize("limits", LIMITS)
@pytest.mark.parametrize("with_lease", [False, True])
async def test_a_settle_sends_what_the_store_would_build(
    limits: dict[str, Any], with_lease: bool
) -> None:
    plan = plan_for("p", "t", tenant(**limits), "m")
    sent: list[tuple[list[str], list[Any]]] = []

    class Store:
        def adjust_reply_soon(self, keys: Any, args: Any) -> asyncio.Future[Any]:
            sent.append((list(keys), list(args)))
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    config = TenantsConfig.model_validate({"tenants": {"t": {"api_keys": [KEY_HASH]}}})
    limiter = RateLimiter(Store(), None, config, RateLimitConfig(), "p")  # type: ignore[arg-type]
    lease = LeaseSpec(plan.inflight_key, "member", 3, 30_000) if with_lease else None
    for delta in (-13, 0, 7):
        limiter._send_planned_adjust(plan, delta, lease)
        specs = [b.spec(delta) for b in plan.token_buckets] if delta else []
        if not specs and lease is None:
            assert not sent
            continue
        expected_keys, expected_args = adjust_call(specs, lease, None)
        keys, args = sent.pop()
        assert wire(keys, args) == wire(expected_keys, expected_args)


@given(
    amount=st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=False)),
    member=st.text(max_size=30),
    amounts=st.lists(st.integers(0, 6), max_size=3, unique=True).map(sorted),
    lease=st.booleans(),
)
def test_a_packed_call_is_the_command_packed_whole(
    amount: Any, member: str, amounts: list[int], lease: bool
) -> None:
    keys = ["a:{t}:requests", "a:{t}:tokens"]
    args: list[Any] = [2, b"10.5", b"0.001", 1, b"1000.0", b"1.5", 0]
    if lease:
        args += ["", 3, 30_000]
    packer = PackedCall("f" * 40, keys, args, amounts, 7 if lease else None)
    whole = list(args)
    for i in amounts:
        whole[i] = amount
    if lease:
        whole[7] = member
    expected = pack_command(("EVALSHA", "f" * 40, len(keys), *keys, *whole))
    assert packer.pack(amount, member if lease else None) == expected


@pytest.mark.parametrize("limits", LIMITS)
async def test_packed_calls_are_those_the_store_would_pack(limits: dict[str, Any]) -> None:
    """Where calls are coalesced, the limiter sends its takes and settles packed from
    parts made once: the bytes of the calls `take` and `adjust_soon` would make."""
    store = RedisBuckets(FakeAsyncRedis())
    coalesced: list[tuple[Any, list[str], list[Any], bytes | None]] = []

    def call(
        script: Any, keys: Any, args: Any, urgent: bool = True, packed: bytes | None = None
    ) -> asyncio.Future[Any]:
        coalesced.append((script, list(keys), list(args), packed))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result([1, "1.5"] + [1, "2", 0, 0] * 4 + [1, 1])
        return done

    assert store._coalescer is not None
    store._coalescer.call = call  # type: ignore[method-assign]
    config = TenantsConfig.model_validate(
        {"tenants": {"t": {"api_keys": [KEY_HASH], "limits": limits}}}
    )
    limiter = RateLimiter(store, None, config, RateLimitConfig(), "p")
    plan = limiter._plan("t", "m")
    assert plan.packers is not None

    packed_calls = 0

    def sent() -> bytes:
        nonlocal packed_calls
        script, keys, args, packed = coalesced.pop()
        assert not coalesced
        packed_calls += packed is not None
        whole = pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))
        return whole if packed is None else packed

    leases: list[LeaseSpec | None] = [None]
    if plan.max_concurrent is not None:
        leases.append(LeaseSpec(plan.inflight_key, "req-1", plan.max_concurrent, 30_000))
    for lease in leases:
        for amount in (0, 25, 10**6):
            await limiter._take_in_redis(plan, amount, lease)
            packed = sent()
            specs = [b.spec(c) for b, c in zip(plan.buckets, plan.costs(amount), strict=True)]
            await store.take(specs, lease)
            assert packed == sent()
        for amount in (-13, 0, 7):
            limiter._send_planned_adjust(plan, amount, lease)
            packed = sent() if coalesced else b""
            specs = [b.spec(amount) for b in plan.token_buckets] if amount else []
            if specs or lease is not None:
                await store.adjust_soon(specs, lease)
            assert packed == (sent() if coalesced else b"")
    # Every take (the store's own are packed when sent), and the charges and refunds.
    assert packed_calls == 3 * len(leases) + 2 * len(leases) * bool(plan.token_buckets)
