"""Serving requests: what a running gateway holds (`runtime`), API keys to tenants
(`auth`), a request through admission and its fallback chain (`dispatch`), live reload
of the tenants file (`reload`), and the state it reports to `/metrics` (`gateway_state`).
"""
