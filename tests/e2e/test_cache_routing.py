"""Cache-aware routing against real Triton replicas with prefix caches (issue 17).

Three simulated replicas of `llm-chat` (16-token KV blocks, an LRU per replica) behind
gateways whose model routes `cache_aware`. Which replica served a request is read from
the gateway's `gateway_replica_requests_total`; where it should have gone, from a ring
built here the way every gateway builds it.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from gateway.upstream.ring import HashRing, position
from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.dns_server import Zone, dns_server
from tests.e2e.conftest import start_sim
from tests.e2e.stack import Gateway, model, replica_requests, start_gateway, tenant
from tests.polling import wait_until

MODEL = "llm-chat"
# 2 ms a token; prefill 20 microseconds a prompt byte.
SPEC = f"{MODEL}=2"
CACHE_AWARE = {"policy": "cache_aware"}
TENANT = "cache-router"
TENANTS = {TENANT: tenant(TENANT, ["*"])}
API_KEY = f"sk-test-{TENANT}"
SYSTEM = "".join(f"Rule {i}: answer in plain words, cite the file you read. " for i in range(40))


@pytest.fixture(scope="module")
def trio() -> Iterator[list[TritonSim]]:
    started: list[TritonSim] = []
    try:
        for _ in range(3):
            started.append(start_sim(SPEC))
        yield started
    finally:
        for sim in started:
            sim.stop()


def chat_model(urls: list[str], **extra: Any) -> dict[str, Any]:
    return {MODEL: model("triton_http", urls, routing=CACHE_AWARE, **extra)}


def gateway_of(tmp: Path, redis_url: str, models: dict[str, Any]) -> Gateway:
    return start_gateway(tmp, models, redis_url, tenants=TENANTS)


def client(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key=API_KEY, max_retries=0)


def owner(urls: list[str], session: str) -> str:
    ring = HashRing(urls, 100)
    return ring.urls[ring.walk(position(b"session\x00" + session.encode()))[0]]


def served(gateways: list[Gateway]) -> Counter[str]:
    """Requests each replica answered, over all `gateways`."""
    total: Counter[str] = Counter()
    for gateway in gateways:
        total.update(replica_requests(gateway, MODEL))
    return total


def counted(gateway: Gateway, name: str, **labels: str) -> float:
    """The sum of `name`'s samples of MODEL with `labels`, on the gateway's /metrics."""
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    wanted = {"model": MODEL, **labels}
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and wanted.items() <= sample.labels.items()
    )


def ask(gateway: Gateway, messages: list[dict[str, str]], session: str | None = None) -> Any:
    extra = {} if session is None else {"prompt_cache_key": session}
    return client(gateway).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        extra_body=extra,  # type: ignore[arg-type]
    )


def test_a_conversation_stays_on_its_replica_across_gateways_and_reuses_its_cache(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    urls = [sim.http_url for sim in trio]
    one = gateway_of(tmp_path / "one", redis_url, chat_model(urls))
    two = gateway_of(tmp_path / "two", redis_url, chat_model(urls))
    try:
        gateways = [one, two]
        where: dict[str, set[str]] = {}
        prompt_tokens = cached_tokens = 0
        for conversation in range(6):
            session = f"conversation-{conversation}"
            messages = [{"role": "system", "content": SYSTEM}]
            previous_prompt = 0
            for turn in range(4):
                messages.append({"role": "user", "content": f"Turn {turn} of {session}: go on."})
                gateway = gateways[turn % 2]  # each turn through the other gateway
                before = served(gateways)
                answer = ask(gateway, messages, session)
                after = served(gateways)
                where.setdefault(session, set()).update((after - before).keys())
                details = answer.usage.prompt_tokens_details
                assert details is not None and details.cached_tokens is not None
                if turn:  # everything up to the last turn's prompt is cached
                    assert details.cached_tokens >= previous_prompt - 16
                previous_prompt = answer.usage.prompt_tokens
                prompt_tokens += answer.usage.prompt_tokens
                cached_tokens += details.cached_tokens
                messages.append(
                    {"role": "assistant", "content": answer.choices[0].message.content or ""}
                )
        for session, replicas in where.items():
            assert replicas == {owner(urls, session)}, session
        assert len({next(iter(r)) for r in where.values()}) > 1  # sessions spread
        # The replicas' counts, as the metrics show them per replica, add up to the usage.
        for name, expected in [
            ("gateway_replica_prompt_tokens_total", prompt_tokens),
            ("gateway_replica_cached_prompt_tokens_total", cached_tokens),
        ]:
            assert sum(counted(g, name) for g in gateways) == expected
        assert cached_tokens > prompt_tokens / 2
    finally:
        stop(one.process)
        stop(two.process)


def test_a_responses_conversation_stays_on_one_replica_through_previous_response_id(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    urls = [sim.http_url for sim in trio]
    gateways = [
        gateway_of(tmp_path / "one", redis_url, chat_model(urls)),
        gateway_of(tmp_path / "two", redis_url, chat_model(urls)),
    ]
    try:
        previous: str | None = None
        first = ""
        placed: list[str] = []
        inputs: list[int] = []
        for turn in range(5):
            gateway = gateways[turn % 2]
            before = served(gateways)
            response = client(gateway).responses.create(
                model=MODEL,
                instructions=SYSTEM,
                input=f"Step {turn}: go on.",
                previous_response_id=previous,
                max_output_tokens=4,
            )
            (replica,) = (served(gateways) - before).keys()
            placed.append(replica)
            assert response.usage is not None
            if turn >= 2:  # the turn before ran on this replica: its prompt is cached
                assert response.usage.input_tokens_details.cached_tokens >= inputs[-1] - 16
            inputs.append(response.usage.input_tokens)
            first = first or response.id
            previous = response.id
    finally:
        for gateway in gateways:
            stop(gateway.process)
    # From the second turn on, the conversation's key is its first response: one replica,
    # through either gateway.
    assert set(placed[1:]) == {owner(urls, first)}


async def post_chat(http: aiohttp.ClientSession, gateway: Gateway, body: dict[str, Any]) -> int:
    """One whole chat completion; its status."""
    body = {"model": MODEL, "max_tokens": 4, **body}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with http.post(f"{gateway.base_url}/chat/completions", json=body,
                         headers=headers) as response:  # fmt: skip
        await response.read()
        return response.status


async def burst(gateway: Gateway, bodies: list[dict[str, Any]]) -> Counter[int]:
    """All of `bodies` at once; the statuses."""
    async with aiohttp.ClientSession() as http:
        statuses = await asyncio.gather(*(post_chat(http, gateway, b) for b in bodies))
    return Counter(statuses)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_prompts_shorter_than_a_block_go_by_load(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    urls = [sim.http_url for sim in trio]
    gateway = gateway_of(tmp_path, redis_url, chat_model(urls, prompt_template="plain"))
    try:
        # Under 64 bytes as rendered: no block, no key; the least-loaded replica each.
        statuses = await burst(gateway, [{"messages": user(f"hi {i}")} for i in range(24)])
        counts = served([gateway])
    finally:
        stop(gateway.process)
    assert statuses == {200: 24}
    assert set(counts) == set(urls) and max(counts.values()) <= 12


async def test_a_session_key_that_keeps_changing_spreads_like_any_key(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    urls = [sim.http_url for sim in trio]
    gateway = gateway_of(tmp_path, redis_url, chat_model(urls))
    sessions = [f"fresh-{i}" for i in range(45)]
    try:
        bodies = [
            {"messages": [{"role": "system", "content": SYSTEM}, *user("same question")],
             "prompt_cache_key": session}
            for session in sessions
        ]  # fmt: skip
        statuses = await burst(gateway, bodies)
        counts = served([gateway])
    finally:
        stop(gateway.process)
    assert statuses == {200: len(sessions)}
    assert set(counts) == set(urls)  # each new key lands wherever its hash falls
    assert max(counts.values()) < len(sessions) * 0.7


async def test_one_hot_prefix_beyond_one_replica_spreads_within_the_bound(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    urls = [sim.http_url for sim in trio]
    gateway = gateway_of(tmp_path, redis_url, chat_model(urls, max_tokens_default=64))
    try:
        # One long shared prefix and no session: every request has the same owner. At
        # once, 30 of them are more than the bound (1.25 x the mean) lets it take.
        bodies = [
            {"messages": [{"role": "system", "content": SYSTEM}, *user(f"question {i}")],
             "max_tokens": 64}
            for i in range(30)
        ]  # fmt: skip
        statuses = await burst(gateway, bodies)
        counts = served([gateway])
        skipped = counted(gateway, "gateway_routing_preferred_skipped_total", reason="load")
    finally:
        stop(gateway.process)
    assert statuses == {200: 30}
    assert len(counts) >= 2  # spread over the ring
    assert max(counts.values()) < 30
    assert skipped > 0


async def test_a_killed_replica_passes_its_sessions_to_their_next_owner(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> None:
    victim = start_sim(SPEC)
    urls = [trio[0].http_url, trio[1].http_url, victim.http_url]
    gateway = gateway_of(tmp_path, redis_url, chat_model(urls))
    sessions = [f"kill-{i}" for i in range(12)]
    try:
        on_victim = [s for s in sessions if owner(urls, s) == victim.http_url]
        assert on_victim  # 12 sessions over 3 replicas
        statuses: Counter[int] = Counter()

        async def load(http: aiohttp.ClientSession) -> None:
            for round_ in range(6):
                bodies = [{"messages": user(SYSTEM + f" {s} {round_}"), "prompt_cache_key": s}
                          for s in sessions]  # fmt: skip
                statuses.update(
                    await asyncio.gather(*(post_chat(http, gateway, b) for b in bodies))
                )

        async with aiohttp.ClientSession() as http:
            running = asyncio.create_task(load(http))
            await asyncio.sleep(0.3)
            victim.kill()  # mid-run: requests on it fail over to their next owner
            await running
            before = served([gateway])
            for session in sessions:
                await post_chat(
                    http, gateway, {"messages": user(SYSTEM), "prompt_cache_key": session}
                )
            after = served([gateway])
        moved = after - before
    finally:
        stop(gateway.process)
        victim.stop()
    assert statuses == {200: 6 * len(sessions)}  # nothing lost, nothing refused
    assert victim.http_url not in moved
    survivors = urls[:2]
    expected = Counter(owner(survivors, s) for s in sessions)
    assert moved == expected  # each session on the owner it has on the ring without the victim
    for session in sessions:
        if session not in on_victim:  # the others never moved
            assert owner(survivors, session) == owner(urls, session)


SERVICE = "_http._tcp.triton-llm-chat.example.internal"


@pytest.fixture
def discovered(
    trio: list[TritonSim], redis_url: str, tmp_path: Path
) -> Iterator[tuple[Gateway, Zone]]:
    with dns_server() as (nameserver, zone):
        for index in range(3):
            zone.set_a(f"pod-{index}.example.internal", ["127.0.0.1"])
        zone.set_srv(SERVICE, [(f"pod-{i}.example.internal", trio[i].port) for i in (0, 1)])
        models = {
            MODEL: {
                "backend": "triton_http",
                "max_tokens_default": 4,
                "health": {"interval_s": 0.5, "timeout_s": 1.0},
                "routing": CACHE_AWARE,
                "discovery": {"dns": SERVICE, "record": "SRV", "interval_s": 0.3,
                              "nameservers": [nameserver]},
            }
        }  # fmt: skip
        gateway = gateway_of(tmp_path, redis_url, models)
        try:
            yield gateway, zone
        finally:
            stop(gateway.process)


async def test_an_added_replica_takes_only_the_sessions_it_now_owns(
    discovered: tuple[Gateway, Zone], trio: list[TritonSim]
) -> None:
    gateway, zone = discovered
    two = [trio[0].http_url, trio[1].http_url]
    three = [sim.http_url for sim in trio]
    sessions = [f"grow-{i}" for i in range(15)]
    statuses: Counter[int] = Counter()

    async def where(http: aiohttp.ClientSession) -> dict[str, str]:
        placed = {}
        for session in sessions:
            before = served([gateway])
            statuses[
                await post_chat(
                    http, gateway, {"messages": user(SYSTEM), "prompt_cache_key": session}
                )
            ] += 1
            (placed[session],) = (served([gateway]) - before).keys()
        return placed

    async with aiohttp.ClientSession() as http:
        first = await where(http)
        stop_load = asyncio.Event()

        async def load() -> None:
            while not stop_load.is_set():
                statuses[
                    await post_chat(
                        http,
                        gateway,
                        {"messages": user(SYSTEM + " more"), "prompt_cache_key": "busy"},
                    )
                ] += 1

        workers = [asyncio.create_task(load()) for _ in range(3)]
        zone.set_srv(SERVICE, [(f"pod-{i}.example.internal", trio[i].port) for i in range(3)])

        async def three_replicas() -> bool:
            return f"were {two[0]}, {two[1]})" in await asyncio.to_thread(lambda: gateway.log)

        await wait_until(three_replicas)
        stop_load.set()
        await asyncio.gather(*workers)
        second = await where(http)
    assert set(statuses) == {200}
    assert first == {s: owner(two, s) for s in sessions}
    assert second == {s: owner(three, s) for s in sessions}
    moved = {s for s in sessions if first[s] != second[s]}
    assert moved  # 15 sessions: the new replica owns some
    assert all(second[s] == trio[2].http_url for s in moved)  # only to the new one
