"""The queueing replay: a discrete-event simulation of a job trace on a GPU cluster, with
tenant quotas and fair share, preemption (with checkpoints) and node failures.

Pure: no I/O (the trace's CSV and the tenants' YAML are read in `experiments` and
`tenancy.load_tenants`). See docs/scheduler.md, "Tenants, preemption and failures".
"""
