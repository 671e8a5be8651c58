"""Ops edit tenants.yaml while the gateway serves: applied live, refused when invalid."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import chat, key
from tests.polling import wait_until

TENANTS: dict[str, Any] = {
    "ops": tenant("ops", ["*"], admin=True),
    "few": tenant("few", ["*"], limits={"requests_per_minute": 3}),
}


def _serve(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path, watch: bool
) -> Iterator[Gateway]:
    models = {"llm-small": model("triton_grpc", [sims[0].grpc_target])}
    settings = {
        "redis": {"url": redis_url, "key_prefix": f"reload-{time.time_ns()}"},
        "server": {"watch_tenants_file": watch},
    }
    gw = start_gateway(tmp_path, models, redis_url, tenants=TENANTS, gateway=settings)
    try:
        yield gw
    finally:
        stop(gw.process)


@pytest.fixture
def gateway(sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway that watches its tenants file."""
    yield from _serve(sims, redis_url, tmp_path, watch=True)


@pytest.fixture
def unwatched(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> Iterator[Gateway]:
    """A gateway that reloads only on SIGHUP or the admin API."""
    yield from _serve(sims, redis_url, tmp_path, watch=False)


async def limit_of(session: aiohttp.ClientSession, gw: Gateway, who: str) -> str | None:
    status, headers, _ = await chat(session, gw, who)
    return headers.get("x-ratelimit-limit-requests") if status in (200, 429) else str(status)


async def test_file_change_applies_under_load(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        stop_load = asyncio.Event()
        statuses: Counter[int] = Counter()

        async def load() -> None:
            while not stop_load.is_set():
                status, _, _ = await chat(session, gateway, "few")
                statuses[status] += 1

        workers = [asyncio.create_task(load()) for _ in range(4)]
        await asyncio.sleep(0.3)
        raised = {**TENANTS, "few": tenant("few", ["*"], limits={"requests_per_minute": 600})}
        gateway.write_tenants(raised)

        async def applied() -> bool:
            return await limit_of(session, gateway, "few") == "600"

        took = await wait_until(applied)
        print(f"tenants.yaml change applied after {took:.2f} s")  # for docs/benchmarks.md
        stop_load.set()
        await asyncio.gather(*workers)
        # The bucket level carries over; at the new rate (10/s, not one per 20 s) it
        # holds a request again a moment later.
        await asyncio.sleep(0.3)
        status, _, _ = await chat(session, gateway, "few")
    assert set(statuses) <= {200, 429}
    assert statuses[429] > 0
    assert status == 200
    assert "tenant few: limits.requests_per_minute 3 -> 600" in gateway.log
    reloads = [
        line
        for line in map(orjson.loads, gateway.log.splitlines())
        if line.get("event") == "config_reload"
    ]
    assert reloads[-1]["result"] == "applied"
    assert "tenant few: limits.requests_per_minute 3 -> 600" in reloads[-1]["changes"]


async def test_invalid_file_is_refused_and_the_running_limits_stay(gateway: Gateway) -> None:
    gateway.tenants_path.write_text("tenants:\n  few:\n    api_keys: [sha256:00]\n    limitz: {}\n")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.ops_url}/admin/reload", headers=key("ops")) as response:
            body = await response.json()
        assert await limit_of(session, gateway, "few") == "3"
    assert response.status == 400
    path = str(gateway.tenants_path)
    assert f"{path}:3: tenants.few.api_keys[0]: malformed key hash" in body["problems"][0]
    assert f"{path}:4: tenants.few: unknown key 'limitz'" in body["problems"]
    assert "running tenants stay" in body["error"]["message"]
    assert "refused, the running tenants stay" in gateway.log


async def test_an_unreadable_edit_is_refused_by_the_watcher_which_goes_on_watching(
    gateway: Gateway,
) -> None:
    """A control character is a YAML reader error, not a parse error: it used to escape
    the loader and end the file watch for good."""
    gateway.tenants_path.write_text("tenants:\n  few:\x07\n")
    async with aiohttp.ClientSession() as session:

        async def refused() -> bool:
            return "reload (file changed) refused" in gateway.log

        await wait_until(refused)
        assert await limit_of(session, gateway, "few") == "3"  # the running limits stay
        raised = {**TENANTS, "few": tenant("few", ["*"], limits={"requests_per_minute": 600})}
        gateway.write_tenants(raised)

        async def applied() -> bool:
            return await limit_of(session, gateway, "few") == "600"

        await wait_until(applied)
    assert f"{gateway.tenants_path}:2: invalid YAML" in gateway.log


async def test_sighup_reloads_and_keys_change_at_once(unwatched: Gateway) -> None:
    gateway = unwatched
    renamed = {"ops": TENANTS["ops"], "newcomer": tenant("newcomer", ["*"])}
    gateway.write_tenants(renamed)
    async with aiohttp.ClientSession() as session:
        # Not watching: the edit alone changes nothing.
        assert (await chat(session, gateway, "few"))[0] == 200
    gateway.process.send_signal(signal.SIGHUP)
    async with aiohttp.ClientSession() as session:

        async def newcomer_in() -> bool:
            return (await chat(session, gateway, "newcomer"))[0] == 200

        await wait_until(newcomer_in)
        removed, _, _ = await chat(session, gateway, "few")
    assert removed == 401
    assert "reload (SIGHUP) applied" in gateway.log
    assert "tenant few: removed" in gateway.log
    assert "tenant newcomer: added" in gateway.log


async def test_admin_reload_needs_an_admin_key(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.ops_url}/admin/reload", headers=key("few")) as refused:
            assert refused.status == 403
        async with session.post(f"{gateway.ops_url}/admin/reload", headers=key("ops")) as applied:
            body = await applied.json()
    assert applied.status == 200
    assert body == {"applied": True, "changes": []}


def configmap_update(directory: Path, files: dict[str, str]) -> None:
    """Update `directory` as the kubelet updates a mounted ConfigMap (its AtomicWriter):
    the files go into a new hidden timestamped directory, a `..data_tmp` symlink to it is
    renamed over `..data` (one atomic switch for every file), each visible file is a
    symlink through `..data`, and the old directory is removed. The files themselves are
    never written in place: a watcher that looks only at them misses the update."""
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.time_ns() % 10**9}"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    data = directory / "..data"
    old = data.resolve() if data.is_symlink() else None
    (directory / "..data_tmp").symlink_to(stamp.name)
    (directory / "..data_tmp").rename(data)
    for name in files:
        visible = directory / name
        if not visible.is_symlink():  # first time: the regular file becomes the link
            (directory / f".{name}.link").symlink_to(f"..data/{name}")
            (directory / f".{name}.link").rename(visible)
    if old is not None:
        shutil.rmtree(old)


async def test_a_configmap_update_swapping_the_data_symlink_is_applied(gateway: Gateway) -> None:
    directory = gateway.config_dir
    gateway_yaml = (directory / "gateway.yaml").read_text()
    current = (directory / "tenants.yaml").read_text()
    # As Kubernetes mounts it: both files through ..data (the same content: no change).
    configmap_update(directory, {"gateway.yaml": gateway_yaml, "tenants.yaml": current})
    assert (directory / "tenants.yaml").is_symlink()
    raised = {**TENANTS, "few": tenant("few", ["*"], limits={"requests_per_minute": 600})}
    edited = yaml.safe_dump({"tenants": raised})
    configmap_update(directory, {"gateway.yaml": gateway_yaml, "tenants.yaml": edited})
    async with aiohttp.ClientSession() as session:

        async def applied() -> bool:
            return await limit_of(session, gateway, "few") == "600"

        await wait_until(applied)
    assert "reload (file changed) applied" in gateway.log
    assert "tenant few: limits.requests_per_minute 3 -> 600" in gateway.log
