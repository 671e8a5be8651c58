"""Triton's model repository API: which models a server has loaded, load and unload.

The servers run with `--model-control-mode=explicit`, so a model serves only once it is
loaded through this API. Applying a deployment plan loads each node's placed models and
unloads the deployed models that are no longer placed there; models the plan does not
know are left alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import aiohttp

from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.deployment import DeploymentPlan

_TIMEOUT = aiohttp.ClientTimeout(total=120)  # loading a model can take a while


class RepositoryError(RuntimeError):
    """A Triton server refused or failed a repository call."""


@dataclass(frozen=True, slots=True)
class Action:
    """One repository call made while applying a plan."""

    node: str
    verb: str  # "load" or "unload"
    model: str

    def __str__(self) -> str:
        return f"{self.node}: {self.verb} {self.model}"


async def loaded_models(session: aiohttp.ClientSession, url: str) -> set[str]:
    """The models the server at `url` has loaded and ready."""
    async with session.post(f"{url}/v2/repository/index", json={"ready": True}) as response:
        if response.status != 200:
            raise RepositoryError(f"{url}: repository index: HTTP {response.status}")
        index = await response.json()
    return {entry["name"] for entry in index if entry.get("state", "READY") == "READY"}


async def _call(session: aiohttp.ClientSession, url: str, verb: str, model: str) -> None:
    async with session.post(f"{url}/v2/repository/models/{model}/{verb}") as response:
        if response.status != 200:
            detail = (await response.text())[:200]
            raise RepositoryError(f"{url}: {verb} {model}: HTTP {response.status} {detail}")


async def unloads_for(
    cluster: ClusterConfig, plan: DeploymentPlan, nodes: Iterable[str] | None = None
) -> list[Action]:
    """The unloads `apply_plan` would make now (models loaded where `plan` has none)."""
    deployed = {d.model for d in cluster.deployments}
    wanted = set(nodes) if nodes is not None else {n.name for n in cluster.nodes}
    unloads = []
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        for node in cluster.nodes:
            if node.name in wanted:
                present = await loaded_models(session, node.base_url)
                for model in sorted((present & deployed) - plan.models_on(node.name)):
                    unloads.append(Action(node.name, "unload", model))
    return unloads


async def apply_plan(
    cluster: ClusterConfig,
    plan: DeploymentPlan,
    nodes: Iterable[str] | None = None,
    fence: Callable[[], Awaitable[None]] | None = None,
    *,
    loads: bool = True,
    unloads: bool = True,
) -> list[Action]:
    """Make each node's Triton serve what `plan` places on it; the calls made, in order.

    Every load, on every node, comes before any unload, so a model that moves is served
    somewhere throughout. `nodes` limits the work to some nodes (the others may be down).
    `fence` runs before every load and unload: it raises when this gateway may no longer
    act (gateway_control.placement.leadership), and the calls stop there. `loads` or `unloads`
    false leaves those calls out (a caller that drains replicas between the two).
    """
    deployed = {d.model for d in cluster.deployments}
    wanted = set(nodes) if nodes is not None else {n.name for n in cluster.nodes}
    urls = {n.name: n.base_url for n in cluster.nodes if n.name in wanted}
    actions: list[Action] = []
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        present = {name: await loaded_models(session, url) for name, url in urls.items()}
        for name, url in urls.items() if loads else ():
            for model in sorted(plan.models_on(name) - present[name]):
                if fence is not None:
                    await fence()
                await _call(session, url, "load", model)
                actions.append(Action(name, "load", model))
        for name, url in urls.items() if unloads else ():
            for model in sorted((present[name] & deployed) - plan.models_on(name)):
                if fence is not None:
                    await fence()
                await _call(session, url, "unload", model)
                actions.append(Action(name, "unload", model))
    return actions
