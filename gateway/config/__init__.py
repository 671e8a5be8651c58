"""Gateway configuration: the typed schema and loading it from YAML with line-numbered errors."""

from gateway.config.keys import digest, hash_key
from gateway.config.loader import check_config, key_index, load_config, load_tenants
from gateway.config.schema import (
    AdmissionConfig,
    BackendKind,
    Config,
    FallbackReason,
    GatewayConfig,
    Limits,
    ModelConfig,
    RateLimitConfig,
    RateLimits,
    RedisFailureMode,
    Tenant,
    TenantsConfig,
)
from gateway.config.source import ConfigError, Problem

__all__ = [
    "AdmissionConfig",
    "BackendKind",
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
    "Tenant",
    "TenantsConfig",
    "check_config",
    "digest",
    "hash_key",
    "key_index",
    "load_config",
    "load_tenants",
]
