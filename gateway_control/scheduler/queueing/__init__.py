"""The queueing replay: a discrete-event simulation of a job trace on a GPU cluster, with
tenant quotas and fair share, preemption (with checkpoints) and node failures.

No I/O but `tenancy.load_tenants`, which reads the tenants' YAML (the trace's CSV is read
in `experiments`). See docs/scheduler.md, "Tenants, preemption and failures".
"""
