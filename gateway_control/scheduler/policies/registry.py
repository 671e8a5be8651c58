"""The policies by name: what the command lines and the replay choose from. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway_control.scheduler.fragmentation import Shape
from gateway_control.scheduler.policies.best_fit import BestFit
from gateway_control.scheduler.policies.fgd import FragmentationGradient
from gateway_control.scheduler.policies.fgd_plus import FragmentationGradientPlus
from gateway_control.scheduler.policies.first_fit import FirstFit
from gateway_control.scheduler.policies.policy import Policy
from gateway_control.scheduler.policies.random_fit import RandomFit
from gateway_control.scheduler.policies.topology import TopologyAware

POLICY_NAMES = ("first-fit", "random", "best-fit", "fgd", "fgd-plus", "topology")
BEST_POLICY = "fgd-plus"  # beats fgd on the default workload and every derived family


def make_policy(name: str, seed: int, shapes: Sequence[Shape]) -> Policy:
    """A policy by name; `seed` drives `random`, `shapes` (the target workload) the
    fragmentation-aware ones."""
    factories: dict[str, Callable[[], Policy]] = {
        "first-fit": FirstFit,
        "random": lambda: RandomFit(seed),
        "best-fit": BestFit,
        "fgd": lambda: FragmentationGradient(shapes),
        "fgd-plus": lambda: FragmentationGradientPlus(shapes),
        "topology": lambda: TopologyAware(shapes),
    }
    factory = factories.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return factory()
