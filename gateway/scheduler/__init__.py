"""The offline scheduling laboratory: GPU packing experiments on the Alibaba openb trace
and the queueing replay (quotas, preemption, failures), run by `gateway simulate`.

- `cluster`, `fragmentation`: the GPU cluster model and its fragmentation measure;
- `policies`: placement policies, one per module, and their registry;
- `queueing`: the discrete-event replay of a job trace;
- `experiments`: the experiments, workloads, charts and command lines (file I/O lives
  here and in the loaders of `cluster` and `queueing.tenancy`).

routing.py, cluster_config.py, deployment.py and place_cli.py are runtime code on their
way out of this package; they are not part of the laboratory.
"""
