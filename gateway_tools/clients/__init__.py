"""The coding tools as clients of the gateway: what points each at it."""
