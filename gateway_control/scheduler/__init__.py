"""The offline scheduling laboratory: GPU packing experiments on the Alibaba openb trace
and the queueing replay (quotas, preemption, failures), run by `gateway simulate`.

- `cluster`, `fragmentation`: the GPU cluster model and its fragmentation measure;
- `policies`: placement policies, one per module, and their registry;
- `queueing`: the discrete-event replay of a job trace;
- `experiments`: the experiments, workloads, charts and command lines (file I/O lives
  here and in the loaders of `cluster` and `queueing.tenancy`).

It imports nothing else of the gateway. The runtime uses its policies to place model
replicas on Triton nodes (`gateway_control.placement`) and validates `cluster.yaml`'s policy
names against its registry (`gateway_control.cluster_config`).
"""
