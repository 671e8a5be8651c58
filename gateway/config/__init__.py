"""Configuration: the typed schema (`schema`), YAML with line numbers and `${VAR}` (`source`),
validation into `file:line: message` problems (`validation`, `loader`), `cluster.yaml`
(`cluster_config`) and API key hashing (`keys`)."""

from gateway.config.keys import digest, hash_key
from gateway.config.loader import (
    check_config,
    environment_problems,
    environment_warnings,
    key_index,
    load_config,
    load_tenants,
)
from gateway.config.schema import (
    AdmissionConfig,
    BackendKind,
    Budget,
    Config,
    FallbackReason,
    GatewayConfig,
    Limits,
    ModelConfig,
    RateLimitConfig,
    RateLimits,
    RedisFailureMode,
    Routing,
    RoutingPolicy,
    Tenant,
    TenantsConfig,
)
from gateway.config.source import ConfigError, Problem

__all__ = [
    "AdmissionConfig",
    "BackendKind",
    "Budget",
    "Config",
    "ConfigError",
    "FallbackReason",
    "GatewayConfig",
    "Limits",
    "ModelConfig",
    "Problem",
    "RateLimitConfig",
    "RateLimits",
    "RedisFailureMode",
    "Routing",
    "RoutingPolicy",
    "Tenant",
    "TenantsConfig",
    "check_config",
    "digest",
    "environment_problems",
    "environment_warnings",
    "hash_key",
    "key_index",
    "load_config",
    "load_tenants",
]
