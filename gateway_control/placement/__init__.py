"""Placing model replicas on Triton nodes at run time: `cluster.yaml`'s deployments
planned with the scheduler's policies (`deployment`), applied through Triton's repository
API (`triton_repository`), re-planned when a node dies (`controller`), and the
`gateway place` command (`place_cli`).
"""
