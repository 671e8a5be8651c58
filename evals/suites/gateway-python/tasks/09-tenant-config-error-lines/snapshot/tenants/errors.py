"""Errors raised while loading the tenant config."""


class ConfigError(ValueError):
    """The tenant config is invalid; the message says why."""
