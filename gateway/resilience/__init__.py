"""Keeping requests alive when upstreams fail: failover, health checks."""
