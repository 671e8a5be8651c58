"""Calling one model's replicas: the model's route (`route`), the replica pool and its
choice (`pool`), failover to another replica, active health checks, passive outlier
ejection, retry backoff and budget, and latency averages.
"""
