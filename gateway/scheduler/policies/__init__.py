"""Placement policies: which node (and which GPUs on it) a pod goes to. Pure: no I/O.

TEMPORARY re-exports below, for the runtime modules being moved out of
`gateway.scheduler` (cluster_config.py, deployment.py, their tests) that still import
`gateway.scheduler.policies`; delete them once those import the submodules.
"""

from gateway.scheduler.policies.base import Policy
from gateway.scheduler.policies.registry import BEST_POLICY, POLICY_NAMES, make_policy

__all__ = ["BEST_POLICY", "POLICY_NAMES", "Policy", "make_policy"]
