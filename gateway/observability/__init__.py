"""Logs and (later) metrics."""
