"""Placement policies: which node (and which GPUs on it) a pod goes to. Pure: no I/O.

`policy.py` is the interface, one module per policy, and `registry.py` names them.
"""
